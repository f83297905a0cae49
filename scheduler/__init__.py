"""The scheduler process and the operator's tools: maintenance jobs, heartbeats, user schedules, the
dead-letter archive, the throughput audit, database migration and the single-machine supervisor."""
