package config_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/pgtenant/pgtenant/internal/config"
)

// TestConfigurationDoc_NamesEveryKey: every yaml key of the config structs
// appears in the reference example of docs/configuration.md, so a new key
// cannot ship without its default and reason. A struct used in two places
// (the global pacer and a cluster's) needs each key in one of them.
func TestConfigurationDoc_NamesEveryKey(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(yamlBlocks(t, configDoc)[0]), &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{} // Type.key → the key's path, for the message
	found := map[string]bool{}
	var walk func(typ reflect.Type, n *yaml.Node, path string)
	walk = func(typ reflect.Type, n *yaml.Node, path string) {
		for typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		if n != nil && n.Kind == yaml.DocumentNode {
			n = n.Content[0]
		}
		switch typ.Kind() {
		case reflect.Slice, reflect.Map: // a list of structs, or tiers by name
			var elems []*yaml.Node
			if n != nil && n.Kind == yaml.SequenceNode {
				elems = n.Content
			} else if n != nil && n.Kind == yaml.MappingNode {
				for i := 1; i < len(n.Content); i += 2 {
					elems = append(elems, n.Content[i])
				}
			}
			seg := "[]"
			if typ.Kind() == reflect.Map {
				seg = ".NAME"
			}
			walk(typ.Elem(), nil, path+seg) // the keys, even with no element
			for _, e := range elems {
				walk(typ.Elem(), e, path+seg)
			}
		case reflect.Struct:
			for f := range typ.Fields() {
				key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
				if key == "" || key == "-" {
					continue
				}
				id := typ.Name() + "." + key
				p := strings.TrimPrefix(path+"."+key, ".")
				if q, ok := want[id]; !ok || strings.Count(p, ".") < strings.Count(q, ".") {
					want[id] = p // the shortest path names it best: pacer.x, not clusters[].pacer.x
				}
				var v *yaml.Node
				if n != nil && n.Kind == yaml.MappingNode {
					for i := 0; i+1 < len(n.Content); i += 2 {
						if n.Content[i].Value == key {
							v = n.Content[i+1]
						}
					}
				}
				if v != nil {
					found[id] = true
				}
				walk(f.Type, v, p)
			}
		}
	}
	walk(reflect.TypeFor[config.Config](), &doc, "")
	var missing []string
	for id, p := range want {
		if !found[id] {
			missing = append(missing, p)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("docs/configuration.md's example lacks %d key(s), each with its default and why: %s", len(missing), strings.Join(missing, ", "))
	}
	if len(want) < 100 {
		t.Errorf("found %d keys in the config structs, want them all (100+)", len(want))
	}
}
