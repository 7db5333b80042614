// The resource detail pane: what resources/list says of a resource, what the content cache held of it, a "copy URI"
// button and the raw resources/read result. Names, descriptions and JSON come from resources: text nodes only.
import { json } from "./highlight.js";
import { bytes, h } from "./views.js";

function seconds(s) {
  return `${Math.max(0, Math.round(s)).toLocaleString()} s`;
}

function held(look) {
  if (look.state === "hit") return `fresh for ${seconds(look.freshFor)} more, ${bytes(look.bytes)} held`;
  if (look.state === "expired") return `expired ${seconds(-look.freshFor)} ago, ${bytes(look.bytes)} held`;
  return "not held";
}

// What the cache held before the preview's read, then what the read left there.
export function cacheText(cache) {
  if (cache.state === "uncached") return `not cached: ${cache.why}`;
  const after = cache.after ? held(cache.after) : "";
  if (cache.state === "hit") return `hit: ${held(cache)}`;
  if (cache.state === "expired") return `expired: ${held(cache)}; after this read ${after}`;
  return `miss: this read loaded it; ${cache.after && cache.after.state === "hit" ? `now ${after}`
    : "not kept (its ttl is 0, it depends on who asks, or it exceeds the cache's budget)"}`;
}

// The clipboard API needs a secure context (https, or localhost); elsewhere the URI is selected and copied the old
// way, and stays selected for Ctrl+C if even that is refused.
async function copy(uri, button, heading) {
  let done = false;
  if (navigator.clipboard) {
    try {
      await navigator.clipboard.writeText(uri);
      done = true;
    } catch (_) { /* refused: select it instead */ }
  }
  if (!done) {
    const range = document.createRange();
    range.selectNodeContents(heading);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    try {
      done = document.execCommand("copy");
    } catch (_) { /* left selected */ }
  }
  button.textContent = done ? "Copied" : "Selected: press Ctrl+C to copy";
  setTimeout(() => { button.textContent = "Copy URI"; }, 2000);
}

// The pane for `uri` from a /read body with `detail`: `about` (a definition list and the copy button, shown above the
// content) and `raw` (the resources/read result, collapsed, below it). `heading` shows the URI as text.
export function detailPane(uri, body, heading) {
  const detail = body.detail;
  const listed = detail.listed || {};
  const notes = listed.annotations || {};
  const size = listed.size ?? body.size;
  const fields = [
    ["name", "Name", listed.name], ["title", "Title", listed.title], ["description", "Description", listed.description],
    ["mimeType", "MIME type", listed.mimeType || body.mimeType], ["size", "Size", size === undefined ? null : bytes(size)],
    ["audience", "Audience", notes.audience ? notes.audience.join(", ") : null],
    ["priority", "Priority", notes.priority === undefined ? null : String(notes.priority)],
    ["lastModified", "Last modified", notes.lastModified], ["source", "Source", listed.source],
    ["cache", "Cache", cacheText(detail.cache)], ["ttl", "Clients may keep it", seconds(body.ttl)],
  ].filter(([, , value]) => value !== undefined && value !== null && value !== "");
  const list = h("dl", { class: "detail", "data-testid": "detail" },
    ...fields.map(([key, label, value]) => [h("dt", {}, label), h("dd", { "data-field": key }, value)]));
  const button = h("button", { type: "button", id: "copy-uri" }, "Copy URI");
  button.addEventListener("click", () => copy(uri, button, heading));
  const raw = h("details", { class: "details", "data-testid": "raw" },
    h("summary", {}, "Raw resources/read result" + (detail.truncated ? " (content cut short)" : "")),
    json(JSON.stringify(detail.result)));
  const about = h("section", { class: "details", "aria-label": "Details" },
    detail.listed ? null : h("p", { class: "meta" }, "Not listed: a template answers this URI."),
    list, h("p", {}, button));
  return { about, raw };
}
