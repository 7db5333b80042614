// The TypeScript SDK's own client (what Node-based hosts and the MCP Inspector use) against our server: connect
// over stdio or Streamable HTTP, list every page, list templates, read URIs one by one and all at once, and read a
// URI that does not exist. Prints one JSON object on stdout; the test compares it with what the files hold.
// Usage: node ts_client.mjs stdio <command> <args...> -- <uri>...   |   node ts_client.mjs http <url> <token> -- <uri>...
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const argv = process.argv.slice(2);
const split = argv.indexOf("--");
const [kind, ...target] = argv.slice(0, split);
const uris = argv.slice(split + 1);

const transport = kind === "stdio"
  ? new StdioClientTransport({ command: target[0], args: target.slice(1), env: { ...process.env }, stderr: "inherit" })
  : new StreamableHTTPClientTransport(new URL(target[0]),
      { requestInit: { headers: target[1] ? { Authorization: `Bearer ${target[1]}` } : {} } });
const client = new Client({ name: "ts-interop", version: "1.0.0" });
await client.connect(transport);

const out = { server: client.getServerVersion(), protocol: transport.protocolVersion ?? null,
              capabilities: client.getServerCapabilities(), resources: [], templates: [], reads: {}, batch: {} };
let cursor;
do {
  const page = await client.listResources(cursor ? { cursor } : {});
  out.resources.push(...page.resources);
  cursor = page.nextCursor;
} while (cursor);
out.templates = (await client.listResourceTemplates()).resourceTemplates;
const text = (result) => result.contents.map((c) => c.text ?? `blob:${c.blob}`).join("");
for (const uri of uris) out.reads[uri] = text(await client.readResource({ uri }));
const many = await Promise.all(uris.map((uri) => client.readResource({ uri })));
uris.forEach((uri, i) => { out.batch[uri] = text(many[i]); });
try {
  await client.readResource({ uri: process.env.MISSING_URI || "docs://no/such/file.md" });
  out.missing = null;
} catch (error) {
  out.missing = { code: error.code, message: String(error.message), data: error.data ?? null };
}
await client.ping();
out.pinged = true;
await client.close();
process.stdout.write(JSON.stringify(out));
