"""What agentpost keeps about chats and their channels: the address of a chat (``address``), pairings and
the messages held until approval, the platform ids already taken in (``dedupe``), per-chat cursors,
preferences and agents, channel health, provider sessions, chat lookups and accepted inbound work. Mostly
small stores over ``storage`` (the ``kv`` table or their own table). It may import ``storage``,
``settings``, ``events`` and the plain values beside this folder (``tests/unit/test_layering.py``)."""
