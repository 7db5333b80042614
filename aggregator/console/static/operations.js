// The Sources and Reloads tabs: a row per source the token may see (a failing one highlighted, with its cause when
// the token sees everything), and the last reloads with their change lines or a refused save's located errors.
// Built from text nodes only, like the rest of the page.
import { bytes, clear, h, when } from "./views.js";

export function showSources(box, body) {
  const head = ["Source", "Kind", "Resources", "Listed", "Cache hit rate", "Cached", "Errors", "Last error",
                "Last success", "Next retry", "Changes", "Upstream"];
  const rows = body.sources.map((s) => h("tr", { "data-source": s.id, class: s.failing ? "failing" : "" },
    h("th", { scope: "row" }, s.failing ? [h("span", { class: "bad" }, "failing: "), s.id] : s.id),
    h("td", {}, s.kind), h("td", {}, s.resources.toLocaleString()),
    h("td", {}, when(s.listedAt)),
    h("td", {}, s.cache.hitRate === null ? "—"
      : `${(s.cache.hitRate * 100).toFixed(1)}% of ${s.cache.hits + s.cache.misses}`),
    h("td", {}, bytes(s.cache.bytes)), h("td", { class: s.errors ? "bad" : "" }, String(s.errors)),
    h("td", { class: s.failing ? "bad" : "" }, s.lastError
      ? (s.lastError.at ? `${when(s.lastError.at)}: ` : "") + s.lastError.message
      : s.failing ? "failing (the cause needs a token that sees everything)" : "—"),
    h("td", {}, s.lastSuccessAt ? when(s.lastSuccessAt) : "never"),
    h("td", {}, s.retryAt ? `at ${new Date(s.retryAt * 1000).toLocaleTimeString()}` : "—"),
    h("td", {}, s.change),
    h("td", {}, s.upstream ? `${s.upstream.state || ""}, ${s.upstream.reconnects ?? 0} reconnects` : "—")));
  const table = h("table", {}, h("caption", { class: "sr-only" }, "Sources"),
    h("thead", {}, h("tr", {}, ...head.map((c) => h("th", { scope: "col" }, c)))), h("tbody", {}, ...rows));
  const summary = body.cache ? h("p", { class: "meta" },
    `Content cache: ${body.cache.entries} entries, ${bytes(body.cache.bytes)}, ${body.cache.hits} hits, `
    + `${body.cache.misses} misses`) : null;
  const deployment = [body.cluster ? `Replica ${body.cluster.replica}` + (body.cluster.connected === false
    ? " (cluster unreachable: serving alone)" : "") : null,
    body.manifestDigest ? `manifest sha256 ${body.manifestDigest}` : null].filter(Boolean);
  const where = deployment.length ? h("p", { class: "meta", "data-testid": "deployment" }, deployment.join(" · ")) : null;
  clear(box, where,
    summary, rows.length ? table : h("p", { class: "hint" }, "No sources you may see."));
}

export function showReloads(list, body) {
  const items = body.reloads.map((r) => h("li", { "data-generation": r.generation, "data-ok": String(r.ok) },
    h("h3", { class: r.ok ? "ok" : "bad" },
      [when(r.at), r.generation == null ? null : `generation ${r.generation}`, r.ok ? "applied" : "refused"]
        .filter(Boolean).join(" · ")),
    r.ok ? h("pre", { class: "code" }, r.linesKnown === false ? "(the changes could not be computed: see the log)"
      : r.lines.length ? r.lines.join("\n") : "(nothing you may see changed)") : null,
    r.moreLines ? h("p", { class: "meta" }, `and ${r.moreLines} more lines`) : null,
    !r.ok && r.issues.length ? h("ul", {}, ...r.issues.map((i) => h("li", { class: "bad" },
      `${i.file}:${i.line}:${i.col}: ${i.key || "<root>"}: ${i.message}`))) : null,
    !r.ok && r.error ? h("p", { class: "bad" }, r.error) : null));
  clear(list, ...(items.length ? items : [h("li", { class: "hint" }, "No reload since the server started.")]));
}
