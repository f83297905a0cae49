"""Read models for operators and the people in a chat: the web API's views, the dashboard's chats and one
chat's status, a message's trace from the event log, what runs cost and who is over a budget. They read what
the queue and the event log wrote (and make a few small writes the web API needs); they may import
``storage``, ``events``, ``queue``, ``chat``, ``settings`` and the plain values beside this folder, and
nothing below them imports them (``tests/unit/test_layering.py``)."""
