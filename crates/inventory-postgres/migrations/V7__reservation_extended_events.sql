-- ExtendReservation records RESERVATION_EXTENDED events. The new check is added NOT VALID
-- and validated apart, so the outbox is never locked against writers while rows are checked.
ALTER TABLE outbox DROP CONSTRAINT outbox_event_type_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_event_type_check CHECK (event_type IN (
    'STOCK_ADJUSTED', 'RESERVATION_HELD', 'RESERVATION_CONFIRMED',
    'RESERVATION_RELEASED', 'RESERVATION_EXPIRED', 'RESERVATION_EXTENDED')) NOT VALID;
ALTER TABLE outbox VALIDATE CONSTRAINT outbox_event_type_check;
