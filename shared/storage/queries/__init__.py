"""Every SQL statement of agentpost, by name: one module per table or concern.

The queue, chat, event-log and read-model code above storage calls these by name and holds no SQL text
(``tests/unit/test_sql_ownership.py`` keeps it so). A statement is a module constant in upper case named for
what it does (``RENEW_LEASE``, ``PENDING_FOR_AGENT``), or a function returning the text where its shape
depends on its input (an ``IN`` list, optional filters); parameters are ``:name`` style.

Where SQLite and PostgreSQL differ inside a statement, the text holds a placeholder that
:meth:`shared.storage.dialect.Dialect.sql` fills in for the engine at hand, so the dialect is chosen in one
place:

- ``{lock_rows}``: after a SELECT whose rows the transaction then updates (PostgreSQL ``FOR UPDATE``);
- ``{skip_locked}``: after the SELECT of a claim (PostgreSQL ``FOR UPDATE SKIP LOCKED``);
- ``{and_visible_events}`` / ``{where_visible_events}``: keeps a read of ``events`` to the ids no later
  commit can precede (PostgreSQL; nothing on SQLite).
"""
