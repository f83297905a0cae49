"""``events`` and ``event_consumers``: the durable event log, its consumers' cursors and its cleanup
(:mod:`shared.events.log`), and the change signals a process waits on (:mod:`shared.events.wake`).

Reads of ``events`` keep to the ids a reader may see (``{and_visible_events}``, ``{where_visible_events}``:
PostgreSQL, where an id is final only once every older transaction has ended).
"""

from __future__ import annotations

from shared.storage.dialect import NOTIFY_CHANNEL

#: The topic of every enqueue, claim and completion: most of the log, so it has no topic index (see
#: shared.storage.models.Event) and its readers go by id.
BUSY_TOPIC = "queue"


def topic_filter(topic: str) -> str:
    """The WHERE term for one topic's events (parameter ``:topic``). For the quieter topics it repeats the
    condition of their partial index, which the planners (SQLite's, and PostgreSQL's for a prepared
    statement) use only when the query states it."""
    if topic == BUSY_TOPIC:
        return "topic = :topic"
    return "topic = :topic AND topic <> 'queue'"


# -- reading ---------------------------------------------------------------------------------------------
#: A page of every topic's events after the cursor ``:after``.
READ_AFTER = "SELECT * FROM events WHERE id > :after{and_visible_events} ORDER BY id LIMIT :limit"


def read_topic_after(topic: str) -> str:
    """A page of ``topic``'s events after the cursor ``:after``."""
    return (
        f"SELECT * FROM events WHERE {topic_filter(topic)} AND id > :after{{and_visible_events}} ORDER BY id "
        "LIMIT :limit"
    )


#: The newest cursor. Only what a reader may see: a subscriber starting here must still get an event that
#: commits later below a newer one (PostgreSQL).
LAST_CURSOR = "SELECT COALESCE(MAX(id), 0) FROM events{where_visible_events}"
#: The newest event id of any topic (NULL when the log is empty).
LATEST_ID = "SELECT MAX(id) FROM events{where_visible_events}"


def latest_id_of_topic(topic: str) -> str:
    """The newest event id of ``topic``. Newest first by id, stopping at the first match: MAX() over a filter
    would read every row of a topic that has no index (the busy one)."""
    return f"SELECT id FROM events WHERE {topic_filter(topic)}{{and_visible_events}} ORDER BY id DESC LIMIT 1"


# -- consumers -------------------------------------------------------------------------------------------
#: A consumer's cursor on a topic moves forward only.
ACK = (
    "INSERT INTO event_consumers (consumer, topic, cursor, updated_at) "
    "VALUES (:c, :t, :v, :now) ON CONFLICT (consumer, topic) DO UPDATE "
    "SET cursor = excluded.cursor, updated_at = excluded.updated_at "
    "WHERE event_consumers.cursor < excluded.cursor"
)
CONSUMER_CURSOR = "SELECT cursor FROM event_consumers WHERE consumer = :c AND topic = :t"
CONSUMER_ACK = "SELECT cursor, updated_at FROM event_consumers WHERE consumer = :c AND topic = :t"
#: The cursor of a topic's slowest consumer, below which cleanup by count stops.
SLOWEST_CONSUMER = "SELECT MIN(cursor) FROM event_consumers WHERE topic = :t"

# -- cleanup ---------------------------------------------------------------------------------------------
#: The lowest and highest id a reader may see, bounds of the search by time. Two subqueries: SQLite reads a
#: lone MIN() or MAX() from the end of the primary key, but both in one SELECT scan the whole table.
ID_RANGE = (
    "SELECT (SELECT MIN(id) FROM events{where_visible_events}) AS lo, "
    "(SELECT MAX(id) FROM events{where_visible_events}) AS hi"
)
#: The first event at or after id ``:i``: one step of the search by time.
FIRST_FROM = "SELECT id, created_at FROM events WHERE id >= :i{and_visible_events} ORDER BY id LIMIT 1"
#: Each topic's highest id up to ``:b`` (the marks of what a cleanup by time removes).
TOPIC_MAX_THROUGH = "SELECT topic, MAX(id) AS m FROM events WHERE id <= :b GROUP BY topic"
DELETE_THROUGH = "DELETE FROM events WHERE id <= :b"
#: The highest id among the ``:n`` oldest events through ``:b``: where one batch of a cleanup by time ends.
BATCH_END = "SELECT MAX(id) FROM (SELECT id FROM events WHERE id <= :b ORDER BY id LIMIT :n) AS oldest"
#: Topics holding more than ``:cap`` events. Only events a reader may see: removing one above that bound
#: would let an event committing later below it count as removed (PostgreSQL).
TOPICS_OVER_CAP = (
    "SELECT topic, COUNT(*) AS n FROM events{where_visible_events} GROUP BY topic HAVING COUNT(*) > :cap"
)


def topic_cap_boundary(topic: str) -> str:
    """The id of ``topic``'s event ``:o`` places from its oldest (visible ones only, as above)."""
    return f"SELECT id FROM events WHERE {topic_filter(topic)}{{and_visible_events}} ORDER BY id LIMIT 1 OFFSET :o"


def topic_batch_end(topic: str) -> str:
    """The highest id among ``topic``'s ``:n`` oldest events through ``:b``: where one batch of a cleanup by
    the per-topic cap ends."""
    return (
        f"SELECT MAX(id) FROM (SELECT id FROM events WHERE {topic_filter(topic)} AND id <= :b "
        "ORDER BY id LIMIT :n) AS oldest"
    )


def delete_topic_through(topic: str) -> str:
    """Remove ``topic``'s events up to id ``:b``."""
    return f"DELETE FROM events WHERE {topic_filter(topic)} AND id <= :b"


# -- change signals (run on the waker's own connection, as they are) --------------------------------------
#: SQLite: a number that changes whenever another connection commits (a shared-memory read).
DATA_VERSION = "PRAGMA data_version"
#: PostgreSQL: receive the NOTIFYs writers send inside their transactions.
LISTEN = f"LISTEN {NOTIFY_CHANNEL}"
