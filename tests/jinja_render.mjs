// The npm reference renderer (@huggingface/jinja, what transformers.js renders chat templates
// with) over JSON lines on stdin: {"template", "context"} in, {"ok"} or {"error"} out, as
// tailserve-chat-template --batch does. Used by tests/jinja_differential.py.
//   node jinja_render.mjs NODE_MODULES_DIR < cases.jsonl
import { createRequire } from "node:module";
import path from "node:path";
import readline from "node:readline";

const require = createRequire(path.join(path.resolve(process.argv[2]), "noop.js"));
const { Template } = require("@huggingface/jinja");
const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line) continue;
  const c = JSON.parse(line);
  let out;
  try {
    out = { ok: new Template(c.template).render(c.context) };
  } catch (e) {
    out = { error: String(e && e.message ? e.message : e) };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}
