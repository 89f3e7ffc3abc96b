-- +goose Up
-- A spare's password, sealed with the credentials key, from its build to
-- its claim: the spare's role has that password's verifier (still NOLOGIN)
-- and its front door has its entry already, so a claim hands the password
-- out and turns LOGIN on without waiting for a sync of the front door.
-- Cleared by the claim. NULL: a spare built without a key, or before.
ALTER TABLE tenants ADD COLUMN spare_key_id text, ADD COLUMN spare_sealed bytea;

-- +goose Down
ALTER TABLE tenants DROP COLUMN spare_key_id, DROP COLUMN spare_sealed;
