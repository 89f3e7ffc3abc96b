// Package patroni runs PostgreSQL clusters under Patroni: an etcd of one or
// three members as Patroni's store (Etcd, EtcdCluster), one Patroni per node with the config pgtenant
// writes for it (Node), and a client of Patroni's REST API (Client) that
// reads the members, waits for a leader, checks a node's health and asks
// for a switchover or a failover.
//
// It owns the etcd and Patroni processes it starts (children of the caller,
// each in its own process group), the nodes' dirs (config, log, pgpass, data
// dir) and the settings written to the store at bootstrap (timing,
// synchronous mode). Once a node is started, Patroni alone starts, stops,
// promotes, demotes and rewinds its PostgreSQL: this package never runs
// pg_ctl on a node's data dir, and nothing else (internal/fleet's
// supervisor included) may manage a server that Patroni manages. It does
// not touch the tenants' databases, the catalog or the poolers: following
// the leader is the callers' work.
package patroni
