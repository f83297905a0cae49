"""What agentpost keeps about chats and their channels: the address of a chat (``address``), pairings and
the messages held until approval, the platform ids already taken in (``dedupe``), per-chat cursors,
preferences, agents and sticky default agents (``sticky_agents``), progress-note records
(``progress_notes``), channel health, the values a channel plugin keeps for itself (``kept_values``),
provider sessions, chat lookups and accepted inbound work. Mostly small stores over ``storage`` (the ``kv``
table or their own table), each owning its scopes and key format: the channel adapters keep what they keep
through these, never through ``kv`` itself. It may import ``storage``, ``settings``, ``events`` and the plain
values beside this folder (``tests/unit/test_layering.py``)."""
