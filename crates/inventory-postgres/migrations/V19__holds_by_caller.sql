-- floor: 15 (additive: an index no earlier release reads)
--
-- Per-caller caps (`max_holds`, `max_held_units`) count a caller's live holds before each
-- of its reservations. This index holds only live holds, so the count walks those of one
-- caller, however many settled reservations it has. `IF NOT EXISTS`: on a large table, build
-- it first by hand with `CREATE INDEX CONCURRENTLY reservations_held_by_caller ...` (the same
-- definition), and this migration finds it there.
CREATE INDEX IF NOT EXISTS reservations_held_by_caller
    ON reservations (caller) WHERE state = 'HELD';
