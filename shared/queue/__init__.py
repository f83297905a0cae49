"""The durable queue: every queue operation implemented once for both dialects — enqueue, agent leases and
claims, failures and retries, reply delivery, steering (pauses, stops), operator repairs and statistics —
composed into ``core.Queue``, with the records it takes and returns in ``records``. It may import
``storage``, ``events``, ``settings`` (routing), ``chat`` (the chat address), ``chain_budget`` and the plain
values beside this folder; (for now) one read-model constant is named as an exception in
``tests/unit/test_layering.py``. Nothing here knows of a process, a platform or the CLI."""
