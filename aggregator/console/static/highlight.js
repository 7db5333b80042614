// Syntax highlighting for previews, built as DOM nodes from text (never parsed as HTML): JSON, Markdown, CSV.
import { h } from "./views.js";

const JSON_TOKEN = /("(?:[^"\\]|\\.)*")(\s*:)?|(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|\b(true|false|null)\b/g;

function tokens(text, pattern, classify) {
  const out = [];
  let last = 0;
  for (const match of text.matchAll(pattern)) {
    if (match.index > last) out.push(text.slice(last, match.index));
    out.push(...classify(match));
    last = match.index + match[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

export function json(text) {
  let shown = text;
  try {
    shown = JSON.stringify(JSON.parse(text), null, 2);
  } catch (_) { /* not valid JSON: highlight it as it is */ }
  return h("pre", { class: "code", "data-language": "json" }, ...tokens(shown, JSON_TOKEN, (m) => {
    if (m[1] !== undefined) {
      if (m[2] !== undefined) return [h("span", { class: "tok-key" }, m[1]), m[2]];
      return [h("span", { class: "tok-str" }, m[1])];
    }
    if (m[3] !== undefined) return [h("span", { class: "tok-num" }, m[3])];
    return [h("span", { class: "tok-lit" }, m[4])];
  }));
}

const INLINE = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\n]+\*|_[^_\n]+_)|(\[[^\]\n]+\]\([^)\n]+\))/g;

function inline(line) {
  return tokens(line, INLINE, (m) => {
    if (m[1]) return [h("span", { class: "tok-code" }, m[1])];
    if (m[2]) return [h("span", { class: "tok-strong" }, m[2])];
    if (m[3]) return [h("span", { class: "tok-em" }, m[3])];
    return [h("span", { class: "tok-link" }, m[4])];
  });
}

export function markdown(text) {
  const parts = [];
  let fenced = false;
  for (const line of text.split("\n")) {
    if (line.startsWith("```")) fenced = !fenced;
    if (fenced || line.startsWith("```")) parts.push(h("span", { class: "tok-code" }, line));
    else if (/^#{1,6}\s/.test(line)) parts.push(h("span", { class: "tok-h" }, line));
    else if (line.startsWith(">")) parts.push(h("span", { class: "tok-quote" }, line));
    else parts.push(...inline(line));
    parts.push("\n");
  }
  return h("pre", { class: "code", "data-language": "markdown" }, ...parts);
}

function csvRows(text, separator) {
  const rows = [];
  let row = [], field = "", quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; }
      else if (c === '"') quoted = false;
      else field += c;
    } else if (c === '"') quoted = true;
    else if (c === separator) { row.push(field); field = ""; }
    else if (c === "\n") { row.push(field.replace(/\r$/, "")); rows.push(row); row = []; field = ""; }
    else field += c;
    if (rows.length >= 500) break;
  }
  if (field || row.length) { row.push(field); rows.push(row); }
  return rows;
}

export function csv(text, uri) {
  const rows = csvRows(text, uri.toLowerCase().endsWith(".tsv") ? "\t" : ",");
  if (!rows.length) return h("pre", { class: "code" }, text);
  const [head, ...body] = rows;
  return h("table", { "data-language": "csv" },
    h("thead", {}, h("tr", {}, ...head.map((cell) => h("th", { scope: "col" }, cell)))),
    h("tbody", {}, ...body.map((row) => h("tr", {}, ...row.map((cell) => h("td", {}, cell))))));
}

export function highlighted(text, language, uri) {
  if (language === "json") return json(text);
  if (language === "markdown") return markdown(text);
  if (language === "csv") return csv(text, uri);
  return h("pre", { class: "code" }, text);
}
