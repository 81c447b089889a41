-- ExtendReservation records RESERVATION_EXTENDED events. The wider check is added NOT VALID:
-- every existing row already passed the narrower one, so there is nothing to validate, and
-- the outbox is not scanned while this migration's transaction holds its lock.
ALTER TABLE outbox DROP CONSTRAINT outbox_event_type_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_event_type_check CHECK (event_type IN (
    'STOCK_ADJUSTED', 'RESERVATION_HELD', 'RESERVATION_CONFIRMED',
    'RESERVATION_RELEASED', 'RESERVATION_EXPIRED', 'RESERVATION_EXTENDED')) NOT VALID;
