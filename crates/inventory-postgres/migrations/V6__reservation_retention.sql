-- Reservations in a final state are deleted after RESERVATION_RETENTION (their lines go with
-- them, ON DELETE CASCADE; their events and stored outcomes keep the history). This index is
-- the pruner's work list: only final reservations, oldest change first. Held ones are never
-- pruned.
CREATE INDEX reservations_final_by_update ON reservations (updated_at) WHERE state <> 'HELD';
