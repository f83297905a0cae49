"""What happened and who should look: the durable event log (its interface and cursors in ``entries``; the SQL
driver in ``log``, the in-memory one in ``memory``, the Redis one in ``redis_driver``, the in-process
subscribers they share in ``subscriptions``, the choice of driver in ``drivers``) and cross-process wake-ups
(``wake``, over an inotify watch in ``fswatch`` or PostgreSQL's ``LISTEN``). It may import ``storage``,
``settings`` and the plain values beside this folder; never the queue, chats or read models, which report
through it. Rules enforced by ``tests/unit/test_layering.py``."""
