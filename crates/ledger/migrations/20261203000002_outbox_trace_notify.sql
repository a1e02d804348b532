-- The outbox additions shared with the transfers database (CONTRACT.md §4).

-- W3C trace context of the handling that wrote the event: the relay sends it as headers.
--! outbox:trace_columns

-- Any writer wakes the relay at once.
--! outbox:notify
