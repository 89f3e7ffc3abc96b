// Package templates embeds the example templates, so that benchmarks and the
// crash soak can use `saas` without a checkout. `wide` is generated
// (internal/templates.Wide) at any size.
package templates

import (
	"embed"
	"io/fs"

	tpl "github.com/pgtenant/pgtenant/internal/templates"
)

//go:embed saas/*.sql
var files embed.FS

// Saas returns the files of examples/templates/saas.
func Saas() []tpl.Upload {
	entries, err := fs.ReadDir(files, "saas")
	if err != nil {
		panic(err) // embedded at build time
	}
	var out []tpl.Upload
	for _, e := range entries {
		b, err := files.ReadFile("saas/" + e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, tpl.Upload{Name: e.Name(), Body: string(b)})
	}
	return out
}
