// The TypeScript MCP SDK 1.x's experimental tasks client (2025-11-25 tasks) against run_command,
// over stdio and HTTP: client.experimental.tasks.callToolStream with a task, getTask,
// getTaskResult, listTasks and cancelTask.
//
// Environment: SANDBOX_MCP_BIN (the server binary), MCP_URL (a running HTTP server's /mcp URL),
// MCP_TS_SDK (the node_modules directory holding @modelcontextprotocol/sdk).
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const modules = process.env.MCP_TS_SDK;
const sdk = (p) => import(pathToFileURL(join(modules, "@modelcontextprotocol/sdk/dist/esm", p)).href);
const { Client } = await sdk("client/index.js");
const { StdioClientTransport } = await sdk("client/stdio.js");
const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");
const { CallToolResultSchema } = await sdk("types.js");

async function exercise(name, transport) {
  const client = new Client({ name: "ts-sdk-tasks-interop", version: "0" });
  await client.connect(transport);
  const created = await client.callTool({ name: "create_sandbox", arguments: { timeout: 300 } });
  const sandbox = created.structuredContent.sandbox_id;
  try {
    // A task to its end: the stream yields taskCreated, then the result.
    const seen = [];
    let taskId, result;
    const stream = client.experimental.tasks.callToolStream(
      { name: "run_command", arguments: { sandbox_id: sandbox, command: "printf TS; sleep 1; exit 3" } },
      undefined,
      { task: { ttl: 60000 } },
    );
    for await (const message of stream) {
      seen.push(message.type);
      if (message.type === "taskCreated") taskId = message.task.taskId;
      if (message.type === "result") result = message.result;
      if (message.type === "error") throw message.error;
    }
    assert.equal(seen[0], "taskCreated", `${name}: the call became a task: ${seen}`);
    assert.ok(taskId.endsWith(`.${sandbox}`), `${name}: the handle names the sandbox: ${taskId}`);
    assert.equal(result.structuredContent.exit_code, 3, `${name}: ${JSON.stringify(result)}`);
    assert.equal(result.structuredContent.stdout, "TS");
    assert.equal((await client.experimental.tasks.getTask(taskId)).status, "completed");
    const again = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    assert.equal(again.structuredContent.exit_code, 3, `${name}: tasks/result ${JSON.stringify(again)}`);
    // Cancelled while it runs.
    let longId, last;
    for await (const message of client.experimental.tasks.callToolStream(
      { name: "run_command", arguments: { sandbox_id: sandbox, command: "sleep 60" } },
      undefined,
      { task: { ttl: 60000 } },
    )) {
      last = message;
      if (message.type === "taskCreated") {
        longId = message.task.taskId;
        const cancelled = await client.experimental.tasks.cancelTask(longId);
        assert.equal(cancelled.status, "cancelled", `${name}: ${JSON.stringify(cancelled)}`);
      }
    }
    assert.ok(last.type === "error" || last.result?.isError === true, `${name}: a cancelled task ends as such: ${JSON.stringify(last)}`);
    assert.equal((await client.experimental.tasks.getTask(longId)).status, "cancelled");
    const listed = (await client.experimental.tasks.listTasks()).tasks.map((t) => t.taskId);
    assert.ok(listed.includes(taskId) && listed.includes(longId), `${name}: tasks/list ${listed}`);
    console.log(`typescript sdk tasks over ${name}: ok (${seen.join(", ")})`);
  } finally {
    await client.callTool({ name: "kill_sandbox", arguments: { sandbox_id: sandbox } }).catch(() => {});
    await client.close();
  }
}

await exercise("stdio", new StdioClientTransport({ command: process.env.SANDBOX_MCP_BIN, args: ["stdio"], env: process.env }));
await exercise("http", new StreamableHTTPClientTransport(new URL(process.env.MCP_URL)));
