-- +goose Up
-- The password of a tenant created with an external id, kept for
-- credentials.retry_window so that a retried create (its answer was lost)
-- gets it again. Sealed by the daemon with the operator's key
-- (credentials.key_file, never in the catalog): AES-256-GCM, a random
-- nonce per row, the tenant id as additional data, so that a row copied to
-- another tenant does not open. Never the plaintext. Deleted when the
-- window ends and with the tenant (docs/SECURITY.md, "Credentials").
CREATE TABLE credentials (
    tenant     text PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    key_id     text NOT NULL,  -- fingerprint of the key that sealed it (not the key): names a daemon with another key
    sealed     bytea NOT NULL, -- nonce || ciphertext || tag
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX credentials_expires_at ON credentials (expires_at);
