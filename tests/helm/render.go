// render: renders a Helm chart the way `helm template` does, with the engine Helm itself uses
// (Go text/template + the sprig function library) plus Helm's own functions (include, tpl,
// required, toYaml, fromYaml, fromJson...). Helm is not packaged for Debian; this is what the chart
// tests run instead.
//
//	render -chart DIR [-f values.yaml]... [-release NAME] [-namespace NS] [-notes FILE] > manifest.yaml
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

type valueFiles []string

func (v *valueFiles) String() string     { return strings.Join(*v, ",") }
func (v *valueFiles) Set(s string) error { *v = append(*v, s); return nil }

func readYAML(path string) map[string]interface{} {
	data, err := os.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	out := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &out); err != nil {
		fail("%s: %v", path, err)
	}
	return out
}

// Values from later files override earlier ones, maps merged key by key (Helm's coalescing).
func mergeValues(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				dst[k] = mergeValues(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
	return dst
}

func toYAML(v interface{}) string {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "render: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	chart := flag.String("chart", "", "chart directory")
	release := flag.String("release", "tailserve", "release name")
	namespace := flag.String("namespace", "default", "namespace")
	notes := flag.String("notes", "", "write the rendered NOTES.txt here")
	var files valueFiles
	flag.Var(&files, "f", "values file (repeatable)")
	flag.Parse()
	if *chart == "" {
		fail("-chart is required")
	}
	meta := readYAML(filepath.Join(*chart, "Chart.yaml"))
	values := readYAML(filepath.Join(*chart, "values.yaml"))
	for _, f := range files {
		values = mergeValues(values, readYAML(f))
	}
	chartData := map[string]interface{}{
		"Name": meta["name"], "Version": meta["version"], "AppVersion": meta["appVersion"], "Description": meta["description"],
	}

	funcs := sprig.TxtFuncMap()
	delete(funcs, "env") // Helm removes these two
	delete(funcs, "expandenv")
	tmpl := template.New("chart").Option("missingkey=zero")
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		_ = yaml.Unmarshal([]byte(s), &m)
		return m
	}
	funcs["toJson"] = func(v interface{}) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	funcs["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		_ = json.Unmarshal([]byte(s), &m)
		return m
	}
	funcs["fromJsonArray"] = func(s string) []interface{} {
		var a []interface{}
		_ = json.Unmarshal([]byte(s), &a)
		return a
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil || v == "" {
			return nil, fmt.Errorf("%s", msg)
		}
		return v, nil
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := tmpl.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := tmpl.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = t.Execute(&buf, data)
		return buf.String(), err
	}
	tmpl.Funcs(funcs)

	dir := filepath.Join(*chart, "templates")
	entries, err := os.ReadDir(dir)
	if err != nil {
		fail("%v", err)
	}
	var names []string
	for _, e := range entries {
		name := "templates/" + e.Name()
		text, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			fail("%v", err)
		}
		if _, err := tmpl.New(name).Parse(string(text)); err != nil {
			fail("%s: %v", name, err)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var out strings.Builder
	for _, name := range names {
		base := filepath.Base(name)
		if strings.HasPrefix(base, "_") {
			continue
		}
		data := map[string]interface{}{
			"Values":   values,
			"Chart":    chartData,
			"Release":  map[string]interface{}{"Name": *release, "Namespace": *namespace, "Service": "Helm", "IsInstall": true},
			"Template": map[string]interface{}{"Name": name, "BasePath": "templates"},
		}
		var buf bytes.Buffer
		if err := tmpl.ExecuteTemplate(&buf, name, data); err != nil {
			fail("%s: %v", name, err)
		}
		if base == "NOTES.txt" {
			if *notes != "" {
				if err := os.WriteFile(*notes, buf.Bytes(), 0o644); err != nil {
					fail("%v", err)
				}
			}
			continue
		}
		for _, doc := range strings.Split(buf.String(), "\n---\n") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", name, strings.Trim(doc, "\n"))
		}
	}
	fmt.Print(out.String())
}
