package cluster

// For the tests of cluster_test.
var (
	SchemaObjectsSQL       = schemaObjectsSQL
	CheckOutsideDependents = checkOutsideDependents
)
