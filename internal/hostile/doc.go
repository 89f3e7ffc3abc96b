// Package hostile holds the hostile-tenant suite (its tests only): tenants
// of both modes that log in for real and plant, where the control plane may
// meet them, shadowing functions and operators, triggers that try to get
// back to the session user's privileges, database and role settings,
// template flags, large objects, default privileges, advisory locks and
// long locks; then every control-plane path runs against them, and the
// suite checks that no role gained a privilege, every path finished or
// failed with a clear error within its bound, purges left nothing behind,
// and a neighbour tenant noticed nothing. docs/SECURITY.md is the contract
// these tests hold the code to; each finding of the red-team run that
// started it has a test of its own (findings_test.go).
package hostile
