"""The durable queue: every queue operation implemented once for both dialects — enqueue, agent leases and
claims, failures and retries, reply delivery, steering (pauses, stops), operator repairs and statistics —
each a part of ``core.Queue`` (intake, leases, responses, messages, failures, admin, control: plain classes,
each given the parts it needs), with the records they take and return in ``records``. Beside them, small
stores in the ``kv`` table of an agent's run state (``model_fallback``: until when it runs on its fallback
model; ``workspaces``: where its workspace was made) and of the dead-letter archive's restores
(``dlq_restores``, next to ``admin``'s dead-letter operations). It may import ``storage``, ``events``,
``settings`` (routing, the ``[queue]`` tuning), ``chat`` (the chat address and its key rule),
``chain_budget`` and the plain values beside this folder (``tests/unit/test_layering.py``). Nothing here
knows of a process, a platform or the CLI."""
