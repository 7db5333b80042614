// Deep links: the URL's fragment names the view (a folder, or a filter or search, and the selected resource), so
// Back, reload and a shared link show it again. A link only names things: what it opens is still read with the
// token of whoever opens it, so a link to a hidden resource shows what a link to a missing one shows.
const KEYS = ["prefix", "q", "mimeType", "name", "uri"];

// The view the current URL names: every key, "" when absent.
export function linked() {
  const params = new URLSearchParams(location.hash.slice(1));
  return Object.fromEntries(KEYS.map((key) => [key, params.get(key) || ""]));
}

export function fragmentOf(view) {
  const params = new URLSearchParams();
  for (const key of KEYS) if (view[key]) params.set(key, view[key]);
  const text = params.toString();
  return text ? "#" + text : "";
}

// Adds a history entry for `view` unless the URL already names it; returns the fragment now in the URL.
export function remember(view) {
  const fragment = fragmentOf(view);
  if (fragment !== location.hash) history.pushState(null, "", fragment || location.pathname + location.search);
  return fragment;
}
