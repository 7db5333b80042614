// The operator's console: catalog tree and previews, templates with a form, sources, reloads, live updates.
import * as api from "./api.js";
import { detailPane } from "./detail.js";
import { highlighted } from "./highlight.js";
import { linked, remember } from "./link.js";
import { showReloads, showSources } from "./operations.js";
import { bytes, clear, h } from "./views.js";

const $ = (id) => document.getElementById(id);
const state = { prefix: "", cursor: null, mode: "tree", filter: {}, previewing: null, templateCursor: null,
                tab: "catalog", generation: null, who: null, stream: null, restoring: false, fragment: null };

function showError(error) {
  const box = $("error");
  box.hidden = !error;
  box.textContent = error ? String(error.message || error) : "";
}

async function guarded(work) {
  try {
    showError(null);
    return await work();
  } catch (error) {
    if (error instanceof api.ApiError && error.status === 401) return signIn("The token was refused; enter another.");
    if (error.name !== "AbortError") showError(error);
    return undefined;
  }
}

// --- sign in and who am I ------------------------------------------------------------------------------------

function signOut() {
  api.setToken("");
  if (state.stream) state.stream.abort();
  state.stream = null;
  state.who = null;
  state.previewing = null;
  clear($("tree"));
  clear($("preview"), h("p", { class: "hint" }, "Pick a resource to preview it."));
  live("signed out", "offline");
  signIn("Signed out. Enter a token to sign in again.");
}

function signIn(why) {
  $("app").hidden = true;
  $("sign-out").hidden = true;
  $("login").hidden = false;
  if (why) $("login-why").textContent = why;
  $("token").focus();
}

async function start() {
  let who;
  try {
    who = await api.get("whoami");
  } catch (error) {
    if (error instanceof api.ApiError && error.status === 401) {
      // A token that was given and refused says so (and is forgotten); a first visit just asks for one.
      const given = api.token() !== "";
      api.setToken("");
      return signIn(given ? "The token was refused; enter another." : null);
    }
    return showError(error);
  }
  state.who = who;
  $("login").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = false;
  const server = who.server;
  $("title").textContent = (server.title || server.name) + " — console";
  state.failing = who.failingSources || [];
  facts(who.generation, who.resources);
  viewAsSelector(who);
  await restore();
  performance.mark("console:catalog-ready");  // what the benchmark reads as the catalog's first paint
  if (!state.stream) listen();
}

function facts(generation, resources) {
  state.generation = generation;
  const who = state.who;
  // A scoped caller is told no generation (its steps would count changes it may not see).
  const parts = generation == null ? [] : [`generation ${generation}`];
  if (resources !== undefined) state.resources = resources;
  if (state.resources !== undefined) parts.push(`${state.resources.toLocaleString()} resources visible`);
  if (who) parts.push(`as ${who.caller}` + (who.scopes.length ? ` (${who.scopes.join(", ")})` : ""));
  if (who && who.cluster) {
    parts.push(`replica ${who.cluster.replica}` + (who.cluster.connected === false ? " (alone)" : ""));
  }
  if (who && who.manifestDigest) parts.push(`manifest ${who.manifestDigest.slice(0, 12)}`);
  const failing = state.failing || [];
  const count = failing.length ? `${failing.length} source${failing.length === 1 ? "" : "s"} failing` : null;
  clear($("facts"), parts.join(" · "), count ? " · " : null,
    count ? h("span", { class: "bad", "data-testid": "failing" }, `${count} (${failing.join(", ")})`) : null);
  if (who) document.title = (count ? `(${count}) ` : "") + (who.server.title || who.server.name)
    + " — aggregator console";
}

function viewAsSelector(who) {
  const box = $("viewas");
  if (!who.admin) { box.hidden = true; return; }
  box.hidden = false;
  const select = $("viewas-select");
  const choices = [["", "my token"], ["*", "everything"], ...who.knownScopes.map((s) => [s, `scope ${s}`]),
                   [",", "no scopes"]];
  clear(select, ...choices.map(([value, label]) => h("option", { value }, label)));
  select.value = who.viewingAs || "";
  select.onchange = () => {
    api.setViewAs(select.value);
    state.prefix = "";
    refreshAll();
  };
}

// --- the catalog tree ----------------------------------------------------------------------------------------

function crumbs() {
  const nav = $("crumbs");
  const items = [h("button", { type: "button", onclick: () => openLevel("") }, "all")];
  if (state.mode === "tree" && state.prefix) {
    const scheme = state.prefix.indexOf("://");
    const parts = [];
    let at = scheme >= 0 ? scheme + 3 : 0;
    if (scheme >= 0) parts.push(state.prefix.slice(0, at));
    while (at < state.prefix.length) {
      const slash = state.prefix.indexOf("/", at);
      const end = slash < 0 ? state.prefix.length : slash + 1;
      parts.push(state.prefix.slice(0, end));
      at = end;
    }
    for (const prefix of parts) {
      items.push(" / ", h("button", { type: "button", onclick: () => openLevel(prefix) }, prefix));
    }
  } else if (state.mode !== "tree") {
    items.push(" / ", h("span", {}, state.mode === "search" ? "search results" : "filtered list"));
  }
  clear(nav, ...items);
}

function row(child) {
  if (child.kind === "folder") {
    const label = child.prefix.slice(state.prefix.length) || child.prefix;
    return h("li", { class: "folder" }, h("button", { type: "button", "data-prefix": child.prefix,
      onclick: () => openLevel(child.prefix) },
      h("span", { class: "label" }, label), h("span", { class: "meta" }, `${child.count.toLocaleString()}`)));
  }
  const label = state.mode === "tree" ? child.uri.slice(state.prefix.length) || child.uri : child.uri;
  return h("li", { class: "entry" }, h("button", { type: "button", "data-uri": child.uri,
    "aria-current": state.previewing === child.uri ? "true" : "false",
    onclick: () => preview(child.uri, $("preview")) },
    h("span", { class: "label" }, label, child.snippet ? h("span", { class: "snippet" }, child.snippet) : null),
    h("span", { class: "meta" }, [child.mimeType, child.size !== undefined ? bytes(child.size) : null]
      .filter(Boolean).join(" · "))));
}

async function loadPage(append) {
  const limit = 100;
  let page;
  if (state.mode === "tree") page = await api.get("tree", { prefix: state.prefix, cursor: state.cursor, limit });
  else if (state.mode === "search") {
    // The same filters as the list: mimeType and name narrow the hits too.
    page = await api.get("search", { ...state.filter, cursor: state.cursor, limit: 50 });
  }
  else page = await api.get("list", { ...state.filter, cursor: state.cursor, limit });
  const list = $("tree");
  if (!append) clear(list);
  const first = list.children.length;
  list.append(...page.children.map(row));
  // Re-rendering removed the focused row (Enter on a folder) or the button that was pressed ("Load more" hides):
  // focus goes to the first new row, not to <body>.
  const focused = document.activeElement;
  if (!focused || focused === document.body || focused === $("more")) {
    const target = list.children[append ? first : 0];
    const button = target && target.querySelector("button");
    if (button) button.focus();
  }
  state.cursor = page.nextCursor;
  $("more").hidden = !page.nextCursor;
  const shown = list.children.length;
  if (state.mode === "search") {
    $("tree-count").textContent = `${page.total.toLocaleString()}${page.more ? "+" : ""} found; `
      + `${shown.toLocaleString()} shown`;
  } else {
    $("tree-count").textContent = page.total !== undefined
      ? `${page.total.toLocaleString()} resources under ${state.prefix || "the catalog"}; `
        + `${shown.toLocaleString()} rows shown`
      : `${shown.toLocaleString()} shown${page.nextCursor ? " (more below)" : ""}`;
  }
  if (!shown) list.append(h("li", { class: "hint" }, "Nothing here."));
}

function openLevel(prefix) {
  state.mode = "tree";
  state.prefix = prefix;
  state.cursor = null;
  crumbs();
  linkView();
  return guarded(() => loadPage(false));
}

function applyFilter(event) {
  event.preventDefault();
  const form = new FormData($("filter"));
  const filter = Object.fromEntries([...form.entries()].map(([k, v]) => [k, String(v).trim()]));
  state.cursor = null;
  if (filter.q) {
    state.mode = "search";
    state.filter = { q: filter.q, prefix: filter.prefix, mimeType: filter.mimeType, name: filter.name };
  } else if (filter.mimeType || filter.name) {
    state.mode = "list";
    state.filter = { prefix: filter.prefix, mimeType: filter.mimeType, name: filter.name };
  } else {
    return openLevel(filter.prefix || "");
  }
  crumbs();
  linkView();
  return guarded(() => loadPage(false));
}

// --- deep links ----------------------------------------------------------------------------------------------

// The URL names what the catalog tab shows (not while a link is being restored: that would add its own entry).
function linkView() {
  if (state.restoring) return;
  const shown = state.mode === "tree" ? { prefix: state.prefix } : state.filter;
  state.fragment = remember({ ...shown, uri: state.previewing || "" });
}

// Shows the view the URL names: its folder, or its filter or search (filled into the form), and its resource.
async function restore() {
  const view = linked();
  state.fragment = location.hash;
  state.restoring = true;
  try {
    const filtered = view.q || view.mimeType || view.name;
    for (const [id, key] of [["f-prefix", "prefix"], ["f-mime", "mimeType"], ["f-name", "name"], ["f-q", "q"]]) {
      $(id).value = filtered ? view[key] : "";
    }
    if (state.tab !== "catalog") selectTab("catalog", false);  // shown, then loaded once below
    if (filtered) {
      state.mode = view.q ? "search" : "list";
      state.filter = { q: view.q || undefined, prefix: view.prefix, mimeType: view.mimeType, name: view.name };
      state.cursor = null;
      crumbs();
      await guarded(() => loadPage(false));
    } else {
      await openLevel(view.prefix);
    }
    if (view.uri) await preview(view.uri, $("preview"));
    else {
      state.previewing = null;
      clear($("preview"), h("p", { class: "hint" }, "Pick a resource to preview it."));
    }
  } finally {
    state.restoring = false;
  }
}

function followLink() {
  // Back, Forward, or a fragment typed or pasted: Chromium reports some of these twice (popstate and hashchange).
  if (state.who && location.hash !== state.fragment) restore();
}

// --- preview -------------------------------------------------------------------------------------------------

async function preview(uri, box) {
  const main = box === $("preview");
  if (main) {
    state.previewing = uri;
    linkView();
    for (const button of document.querySelectorAll("#tree button[data-uri]")) {
      button.setAttribute("aria-current", button.dataset.uri === uri ? "true" : "false");
    }
  }
  clear(box, h("h2", {}, uri), h("p", { class: "meta" }, "reading…"));
  let body;
  try {
    // The main preview names this page's event stream, so the server tells it when the previewed file changes.
    const watch = main && state.streamId ? { stream: state.streamId } : {};
    body = await api.get("read", { uri, ...watch, detail: main ? 1 : undefined });
  } catch (error) {
    if (error instanceof api.ApiError && error.status === 401) return signIn("The token was refused; enter another.");
    const why = `${error.status || ""} ${error.message}`;
    if (!main || state.previewing === uri) {
      clear(box, h("h2", {}, uri), h("p", { class: "bad", "data-testid": "read-error" }, why));
    }
    return;
  }
  if (main && state.previewing !== uri) return;  // another resource was picked while this one was read
  const title = h("h2", {}, uri);
  const { about, raw } = body.detail ? detailPane(uri, body, title) : {};
  const meta = h("p", { class: "meta" }, [body.mimeType, bytes(body.size), body.truncated ? "preview cut short" : null]
    .filter(Boolean).join(" · "));
  const download = h("button", { type: "button", onclick: () => save(uri) }, "Download");
  if (body.kind === "text") {
    clear(box, title, meta, about, highlighted(body.text, body.language, uri), h("p", {}, download), raw);
  } else if (body.kind === "image") {
    const image = h("img", { alt: `Preview of ${uri}` });
    clear(box, title, meta, about, image, h("p", {}, download), raw);
    const data = await api.blob("raw", { uri });
    image.src = URL.createObjectURL(data);
  } else {
    clear(box, title, meta, about, h("p", {}, `Binary content: ${bytes(body.size)} of ${body.mimeType}.`),
      h("p", {}, download), raw);
  }
}

async function save(uri) {
  await guarded(async () => {
    const data = await api.blob("raw", { uri });
    const link = h("a", { href: URL.createObjectURL(data), download: uri.split("/").pop() || "resource" });
    document.body.append(link);
    link.click();
    link.remove();
  });
}

// --- templates -----------------------------------------------------------------------------------------------

function templateCard(template) {
  const inputs = template.variables.map((variable) => {
    const id = `t-${template.uriTemplate}-${variable.name}`.replace(/[^A-Za-z0-9_-]/g, "_");
    const list = h("datalist", { id: id + "-values" }, ...variable.values.map((v) => h("option", { value: v })));
    const input = h("input", { id, name: variable.name, list: id + "-values", autocomplete: "off" });
    input.addEventListener("input", () => complete(template, variable.name, input, list));
    input.addEventListener("focus", () => complete(template, variable.name, input, list));
    return [h("label", { for: id }, variable.name), h("div", {}, input, list)];
  });
  const form = h("form", { "aria-label": `Expand ${template.name}` }, ...inputs.flat(),
    h("button", { type: "submit" }, "Expand and preview"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const values = {};
    for (const [key, value] of new FormData(form).entries()) values["v." + key] = String(value);
    await guarded(async () => {
      const { uri } = await api.get("expand", { template: template.uriTemplate, ...values });
      await preview(uri, $("template-preview"));
    });
  });
  return h("li", { "data-template": template.uriTemplate },
    h("h3", {}, template.title || template.name), h("code", {}, template.uriTemplate),
    template.description ? h("p", {}, template.description) : null,
    h("p", { class: "meta" }, [template.kind, template.source ? `source ${template.source}` : null, template.mimeType]
      .filter(Boolean).join(" · ")), form);
}

const completing = new WeakMap();
async function complete(template, name, input, list) {
  const form = input.form;
  const context = {};
  for (const [key, value] of new FormData(form).entries()) {
    if (key !== name && value) context["c." + key] = String(value);
  }
  const asked = input.value;
  completing.set(input, asked);
  try {
    const found = await api.get("complete", { template: template.uriTemplate, name, prefix: asked, ...context });
    if (completing.get(input) !== asked) return;  // a newer keystroke asked since
    clear(list, ...found.values.map((v) => h("option", { value: v })));
  } catch (_) { /* completion is a help, not a requirement */ }
}

async function loadTemplates(append) {
  const page = await api.get("templates", { cursor: append ? state.templateCursor : null });
  const list = $("templates");
  if (!append) clear(list);
  list.append(...page.templates.map(templateCard));
  if (!list.children.length) list.append(h("li", { class: "hint" }, "No templates."));
  state.templateCursor = page.nextCursor;
  $("more-templates").hidden = !page.nextCursor;
}

// --- sources and reloads -------------------------------------------------------------------------------------

async function loadSources() {
  const body = await api.get("sources");
  state.failing = body.failing || [];
  facts(body.generation);
  showSources($("sources"), body);
}

async function loadReloads() {
  showReloads($("reloads"), await api.get("reloads", { limit: 10 }));
}

// --- tabs and live updates -----------------------------------------------------------------------------------

const loaders = { catalog: () => (state.mode === "tree" ? openLevel(state.prefix) : guarded(() => loadPage(false))),
                  templates: () => guarded(() => loadTemplates(false)), sources: () => guarded(loadSources),
                  reloads: () => guarded(loadReloads) };

function selectTab(name, load = true) {
  state.tab = name;
  for (const tab of document.querySelectorAll('[role="tab"]')) {
    const on = tab.id === `tab-${name}`;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $(tab.getAttribute("aria-controls")).hidden = !on;
  }
  return load ? loaders[name]() : undefined;
}

async function refreshAll() {
  // The header's figures and the open tab are fetched side by side: the page shows a change one round trip later.
  const [who] = await Promise.all([guarded(() => api.get("whoami")), loaders[state.tab]()]);
  if (who) { state.who = who; state.failing = who.failingSources || []; facts(who.generation, who.resources); }
  if (state.previewing) await preview(state.previewing, $("preview"));
}

function live(text, mode) {
  const el = $("live");
  el.textContent = text;
  el.dataset.state = mode;
}

function told(data) {
  return data.generation == null ? "" : `: generation ${data.generation}`;
}

async function listen() {
  const controller = new AbortController();
  state.stream = controller;
  let delay = 1000;
  while (!controller.signal.aborted) {
    try {
      for await (const { event, data } of api.events(controller.signal)) {
        delay = 1000;
        if (event === "hello") {
          live("live", "live");
          state.streamId = data.stream;
          // A new stream (first, or after a reconnect) knows no preview yet; reading it again names it, and
          // shows whatever changed while the page was not listening.
          if (state.previewing) await preview(state.previewing, $("preview"));
        }
        else if (event === "catalog" || event === "resync") {
          live("catalog changed" + told(data), "changed");
          await refreshAll();
        } else if (event === "reload") {
          if (data.ok) live("reloaded" + told(data), "changed");
          else live("a save was refused", "refused");
          if (state.tab === "reloads" || state.tab === "sources") await loaders[state.tab]();
        } else if (event === "expired") {
          // The token ran out: the server ended the stream; a new token starts a new one.
          state.stream = null;
          live("token expired", "refused");
          return signIn("Your token expired; enter a new one.");
        } else if (event === "updated" && data.uri === state.previewing) {
          await preview(data.uri, $("preview"));
        }
      }
    } catch (error) {
      if (error instanceof api.ApiError && error.status === 401) {
        state.stream = null;  // signing in again starts a new stream
        return signIn("The token was refused; enter another.");
      }
    }
    live("offline: reconnecting…", "offline");
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 15000);
  }
}

function wire() {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    api.setToken($("token").value.trim());
    $("token").value = "";
    start();
  });
  $("filter").addEventListener("submit", applyFilter);
  window.addEventListener("popstate", followLink);
  window.addEventListener("hashchange", followLink);
  $("filter").addEventListener("reset", () => setTimeout(() => openLevel(""), 0));
  $("more").addEventListener("click", () => guarded(() => loadPage(true)));
  $("sign-out").addEventListener("click", signOut);
  $("more-templates").addEventListener("click", () => guarded(() => loadTemplates(true)));
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  for (const tab of tabs) {
    tab.addEventListener("click", () => selectTab(tab.id.slice(4)));
    tab.addEventListener("keydown", (event) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      if (!step) return;
      const next = tabs[(tabs.indexOf(tab) + step + tabs.length) % tabs.length];
      next.focus();
      selectTab(next.id.slice(4));
    });
  }
}

wire();
start();
