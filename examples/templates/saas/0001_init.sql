-- +goose Up
-- saas: a realistic multi-tenant product schema (accounts, billing, projects,
-- issues, documents, audit). Names are unqualified: in schema mode they land in
-- the tenant's schema, in database mode in its public schema.

CREATE TYPE plan_tier AS ENUM ('free', 'starter', 'pro', 'enterprise');
CREATE TYPE issue_status AS ENUM ('open', 'in_progress', 'blocked', 'done', 'wont_do');

CREATE SEQUENCE invoice_number_seq START 1000;

CREATE TABLE organizations (
    id          bigserial PRIMARY KEY,
    name        text NOT NULL,
    slug        text NOT NULL UNIQUE,
    plan        plan_tier NOT NULL DEFAULT 'free',
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
    id            bigserial PRIMARY KEY,
    email         text NOT NULL UNIQUE,
    display_name  text NOT NULL,
    password_hash text,
    is_active     boolean NOT NULL DEFAULT true,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_login_at timestamptz
);

CREATE TABLE memberships (
    organization_id bigint NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    user_id         bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role            text NOT NULL DEFAULT 'member' CHECK (role IN ('owner', 'admin', 'member', 'guest')),
    joined_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, user_id)
);
CREATE INDEX memberships_user ON memberships (user_id);

CREATE TABLE teams (
    id              bigserial PRIMARY KEY,
    organization_id bigint NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    name            text NOT NULL,
    UNIQUE (organization_id, name)
);

CREATE TABLE team_members (
    team_id bigint NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    user_id bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    PRIMARY KEY (team_id, user_id)
);

CREATE TABLE invitations (
    id              bigserial PRIMARY KEY,
    organization_id bigint NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    email           text NOT NULL,
    token           uuid NOT NULL UNIQUE,
    expires_at      timestamptz NOT NULL,
    accepted_at     timestamptz
);

CREATE TABLE api_keys (
    id              bigserial PRIMARY KEY,
    organization_id bigint NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    prefix          text NOT NULL UNIQUE,
    secret_hash     text NOT NULL,
    created_by      bigint REFERENCES users (id) ON DELETE SET NULL,
    revoked_at      timestamptz
);

CREATE TABLE sessions (
    id         uuid PRIMARY KEY,
    user_id    bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    user_agent text
);
CREATE INDEX sessions_user ON sessions (user_id);
CREATE INDEX sessions_expires ON sessions (expires_at);

CREATE TABLE products (
    id          bigserial PRIMARY KEY,
    sku         text NOT NULL UNIQUE,
    name        text NOT NULL,
    price_cents integer NOT NULL CHECK (price_cents >= 0),
    active      boolean NOT NULL DEFAULT true
);

CREATE TABLE subscriptions (
    id              bigserial PRIMARY KEY,
    organization_id bigint NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    product_id      bigint NOT NULL REFERENCES products (id),
    seats           integer NOT NULL DEFAULT 1 CHECK (seats > 0),
    started_at      timestamptz NOT NULL DEFAULT now(),
    cancelled_at    timestamptz
);
CREATE INDEX subscriptions_org ON subscriptions (organization_id);

CREATE TABLE invoices (
    id              bigserial PRIMARY KEY,
    number          bigint NOT NULL UNIQUE DEFAULT nextval('invoice_number_seq'),
    organization_id bigint NOT NULL REFERENCES organizations (id),
    issued_at       timestamptz NOT NULL DEFAULT now(),
    due_at          timestamptz NOT NULL,
    total_cents     bigint NOT NULL DEFAULT 0,
    paid_at         timestamptz
);
CREATE INDEX invoices_org ON invoices (organization_id, issued_at DESC);

CREATE TABLE invoice_lines (
    id          bigserial PRIMARY KEY,
    invoice_id  bigint NOT NULL REFERENCES invoices (id) ON DELETE CASCADE,
    product_id  bigint REFERENCES products (id),
    description text NOT NULL,
    quantity    integer NOT NULL CHECK (quantity > 0),
    unit_cents  integer NOT NULL
);
CREATE INDEX invoice_lines_invoice ON invoice_lines (invoice_id);

CREATE TABLE payments (
    id          bigserial PRIMARY KEY,
    invoice_id  bigint NOT NULL REFERENCES invoices (id),
    amount      bigint NOT NULL CHECK (amount > 0),
    provider    text NOT NULL,
    provider_id text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (provider, provider_id)
);

CREATE TABLE coupons (
    code        text PRIMARY KEY,
    percent_off integer NOT NULL CHECK (percent_off BETWEEN 1 AND 100),
    valid_until date
);

CREATE TABLE projects (
    id              bigserial PRIMARY KEY,
    organization_id bigint NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    key             text NOT NULL,
    name            text NOT NULL,
    archived        boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (organization_id, key)
);

CREATE TABLE milestones (
    id         bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    title      text NOT NULL,
    due_on     date
);

CREATE TABLE labels (
    id         bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name       text NOT NULL,
    color      text NOT NULL DEFAULT '#888888',
    UNIQUE (project_id, name)
);

CREATE TABLE issues (
    id           bigserial PRIMARY KEY,
    project_id   bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    number       integer NOT NULL,
    title        text NOT NULL,
    body         text,
    status       issue_status NOT NULL DEFAULT 'open',
    priority     smallint NOT NULL DEFAULT 3 CHECK (priority BETWEEN 1 AND 5),
    reporter_id  bigint REFERENCES users (id) ON DELETE SET NULL,
    assignee_id  bigint REFERENCES users (id) ON DELETE SET NULL,
    milestone_id bigint REFERENCES milestones (id) ON DELETE SET NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, number)
);
CREATE INDEX issues_assignee_open ON issues (assignee_id) WHERE status IN ('open', 'in_progress');
CREATE INDEX issues_updated ON issues (project_id, updated_at DESC);

CREATE TABLE issue_labels (
    issue_id bigint NOT NULL REFERENCES issues (id) ON DELETE CASCADE,
    label_id bigint NOT NULL REFERENCES labels (id) ON DELETE CASCADE,
    PRIMARY KEY (issue_id, label_id)
);

CREATE TABLE comments (
    id         bigserial PRIMARY KEY,
    issue_id   bigint NOT NULL REFERENCES issues (id) ON DELETE CASCADE,
    author_id  bigint REFERENCES users (id) ON DELETE SET NULL,
    body       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX comments_issue ON comments (issue_id, created_at);

CREATE TABLE attachments (
    id          bigserial PRIMARY KEY,
    issue_id    bigint NOT NULL REFERENCES issues (id) ON DELETE CASCADE,
    filename    text NOT NULL,
    size_bytes  bigint NOT NULL CHECK (size_bytes >= 0),
    storage_key text NOT NULL UNIQUE
);

CREATE TABLE watchers (
    issue_id bigint NOT NULL REFERENCES issues (id) ON DELETE CASCADE,
    user_id  bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    PRIMARY KEY (issue_id, user_id)
);

CREATE TABLE time_entries (
    id        bigserial PRIMARY KEY,
    issue_id  bigint NOT NULL REFERENCES issues (id) ON DELETE CASCADE,
    user_id   bigint NOT NULL REFERENCES users (id),
    minutes   integer NOT NULL CHECK (minutes > 0),
    logged_on date NOT NULL DEFAULT current_date
);

CREATE TABLE documents (
    id              bigserial PRIMARY KEY,
    organization_id bigint NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    title           text NOT NULL,
    content         text NOT NULL DEFAULT '',
    created_by      bigint REFERENCES users (id) ON DELETE SET NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE document_versions (
    id          bigserial PRIMARY KEY,
    document_id bigint NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
    version     integer NOT NULL,
    content     text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (document_id, version)
);

CREATE TABLE notifications (
    id         bigserial PRIMARY KEY,
    user_id    bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    kind       text NOT NULL,
    payload    jsonb NOT NULL DEFAULT '{}',
    read_at    timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notifications_unread ON notifications (user_id) WHERE read_at IS NULL;

CREATE TABLE webhooks (
    id              bigserial PRIMARY KEY,
    organization_id bigint NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    url             text NOT NULL,
    events          text[] NOT NULL DEFAULT '{}',
    secret          text NOT NULL
);

CREATE TABLE webhook_deliveries (
    id           bigserial PRIMARY KEY,
    webhook_id   bigint NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    status_code  integer,
    attempted_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE feature_flags (
    organization_id bigint NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    flag            text NOT NULL,
    enabled         boolean NOT NULL DEFAULT false,
    PRIMARY KEY (organization_id, flag)
);

CREATE TABLE settings (
    organization_id bigint PRIMARY KEY REFERENCES organizations (id) ON DELETE CASCADE,
    timezone        text NOT NULL DEFAULT 'UTC',
    locale          text NOT NULL DEFAULT 'en',
    data            jsonb NOT NULL DEFAULT '{}'
);

CREATE TABLE audit_log (
    id              bigserial PRIMARY KEY,
    organization_id bigint,
    actor_id        bigint,
    action          text NOT NULL,
    target          text,
    at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_log_org_at ON audit_log (organization_id, at DESC);

-- A view and a function that depend on the tables above.
CREATE VIEW open_issues AS
    SELECT i.id, p.key || '-' || i.number AS ref, i.title, i.status, i.assignee_id, i.updated_at
    FROM issues i JOIN projects p ON p.id = i.project_id
    WHERE i.status IN ('open', 'in_progress', 'blocked');

-- +goose StatementBegin
CREATE FUNCTION touch_updated_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER issues_touch BEFORE UPDATE ON issues FOR EACH ROW EXECUTE FUNCTION touch_updated_at();

INSERT INTO products (sku, name, price_cents) VALUES
    ('starter-monthly', 'Starter (monthly)', 900),
    ('pro-monthly', 'Pro (monthly)', 2900),
    ('enterprise-yearly', 'Enterprise (yearly)', 99000);

-- +goose Down
DROP SCHEMA public CASCADE;
