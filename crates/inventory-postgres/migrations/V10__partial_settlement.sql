-- Partial confirm and release: each line keeps how many of its units were confirmed and
-- released. Adding a column with a constant default rewrites nothing. Rows written before
-- (and reservations settled in one step since) keep zeros and are read by their
-- reservation's state: see `ReservationLine::stored`. The check is added NOT VALID: every
-- existing row has zeros, so there is nothing to validate and the table is not scanned
-- while this migration holds its lock.
ALTER TABLE reservation_lines
    ADD COLUMN confirmed bigint NOT NULL DEFAULT 0,
    ADD COLUMN released  bigint NOT NULL DEFAULT 0;
ALTER TABLE reservation_lines ADD CONSTRAINT reservation_lines_units_within_quantity
    CHECK (confirmed >= 0 AND released >= 0 AND confirmed + released <= quantity) NOT VALID;

ALTER TABLE outbox DROP CONSTRAINT outbox_event_type_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_event_type_check CHECK (event_type IN (
    'STOCK_ADJUSTED', 'RESERVATION_HELD', 'RESERVATION_CONFIRMED',
    'RESERVATION_RELEASED', 'RESERVATION_EXPIRED', 'RESERVATION_EXTENDED',
    'RESERVATION_PARTIALLY_CONFIRMED', 'RESERVATION_PARTIALLY_RELEASED')) NOT VALID;
