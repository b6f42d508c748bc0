// The MCP client of t/68-mcp.t: the official TypeScript SDK's Client and
// StdioClientTransport drive build/idempotency-mcp through each scenario of
// issue 36's acceptance list; raw stdio only for what the SDK cannot send
// (malformed lines). Every result goes to the report (MCP_REPORT, JSON);
// t/68-mcp.t asserts on it, on the upstream's effects and on the secrets.
//
// Environment: MCP_BIN, MCP_CONFIG, MCP_STATE_DIR, MCP_EFFECTS (the counting
// upstream's effects.log), MCP_BASE (nginx), MCP_APPROVE (idempotency-approve),
// MCP_REPORT, MCP_STDERR (every server's stderr, appended), MCP_TEST_TOKEN.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';

const E = process.env;
const report = {};
const stderrLog = fs.createWriteStream(E.MCP_STDERR, { flags: 'a' });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function transport() {
    const t = new StdioClientTransport({
        command: E.MCP_BIN,
        args: ['--config', E.MCP_CONFIG],
        env: { MCP_TEST_TOKEN: E.MCP_TEST_TOKEN },
        stderr: 'pipe',
    });
    t.stderr.pipe(stderrLog, { end: false });
    return t;
}

async function connect() {
    const t = transport();
    const c = new Client({ name: 'idem-test', version: '1.0' });
    await c.connect(t);
    return { c, t };
}

// a tool call's result; a JSON-RPC error as { rpcError: { code, message } }
async function call(c, name, args, opts) {
    try {
        return await c.callTool({ name, arguments: args }, undefined,
            { timeout: 120000, ...(opts || {}) });
    } catch (e) {
        return { rpcError: { code: e.code, message: String(e.message) } };
    }
}

const req = (c, args, opts) => call(c, 'idempotent_request', { target: 'api', ...args }, opts);

function effectsFor(key) {
    let n = 0;
    try {
        for (const l of fs.readFileSync(E.MCP_EFFECTS, 'utf8').split('\n')) {
            if (l && JSON.parse(l).key === key) n++;
        }
    } catch (e) { /* not yet */ }
    return n;
}

function keyOf(op) {
    try { return JSON.parse(fs.readFileSync(`${E.MCP_STATE_DIR}/${op}.json`, 'utf8')).key; }
    catch (e) { return null; }
}

async function until(f, ms) {
    for (let i = 0; i < ms / 50; i++) {
        if (f()) return true;
        await sleep(50);
    }
    return false;
}

// ---- initialize with each protocol version, through the SDK's transport
async function versions() {
    report.versions = {};
    for (const v of ['2025-11-25', '2025-06-18', '2025-03-26', '2024-01-01']) {
        const t = transport();
        const got = new Promise((resolve) => { t.onmessage = resolve; });
        await t.start();
        await t.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {
            protocolVersion: v, capabilities: {}, clientInfo: { name: 'v', version: '1' } } });
        const m = await got;
        report.versions[v] = m.result && m.result.protocolVersion;
        await t.close();
    }
}

// the SDK's Client itself, its initialize rewritten to each version: the
// Client accepts the answer and works (tools/list) under that version
async function versionsClient() {
    report.versionsClient = {};
    for (const v of ['2025-11-25', '2025-06-18', '2025-03-26']) {
        const t = transport();
        let initId;
        let answered;
        const send = t.send.bind(t);
        t.send = (m, o) => {
            if (m.method === 'initialize') { initId = m.id; m.params.protocolVersion = v; }
            return send(m, o);
        };
        const start = t.start.bind(t);
        t.start = () => {
            const onmessage = t.onmessage;
            t.onmessage = (m) => {
                if (m.id === initId && m.result) answered = m.result.protocolVersion;
                onmessage(m);
            };
            return start();
        };
        const c = new Client({ name: `idem-test-${v}`, version: '1.0' });
        await c.connect(t);
        const tools = (await c.listTools()).tools.map((x) => x.name).sort().join(',');
        report.versionsClient[v] = { answered, tools };
        await c.close();
    }
}

async function basics(c) {
    report.tools = (await c.listTools()).tools;
    report.serverVersion = c.getServerVersion();
    report.created = await req(c, { operation: 't-created', path: '/tickets', body: { title: 'a' } });
    report.replayed = await req(c, { operation: 't-created', path: '/tickets', body: { title: 'a' } });
    report.lost1 = await req(c, { operation: 't-lost', path: '/tickets', body: { title: 'slow' },
        headers: { 'X-Delay': '3' } });
    report.lost2 = await req(c, { operation: 't-lost', path: '/tickets', body: { title: 'slow' },
        headers: { 'X-Delay': '3' } });
    report.binary = await req(c, { operation: 't-binary', path: '/tickets', body: { title: 'b' },
        headers: { 'X-Body-Size': '70000' } });
    report.status = await call(c, 'operation_status', { operation: 't-created', target: 'api' });
    report.big = await req(c, { operation: 't-big', path: '/tickets', body: { title: 'big' },
        headers: { 'X-Body-Size': '3000000' } });
    report.list = await call(c, 'list_operations', {});
}

// 20 calls of one operation at once, a ping while they wait; then 20 operations
async function concurrency(c) {
    let pending = 20;
    const calls = [];
    for (let i = 0; i < 20; i++) {
        calls.push(req(c, { operation: 't-conc', path: '/tickets', body: { title: 'c' },
            headers: { 'X-Delay': '1.5' } }).finally(() => pending--));
    }
    await until(() => effectsFor(keyOf('t-conc')) === 1, 10000);
    await c.ping();
    report.pendingAtPing = pending;
    report.conc = await Promise.all(calls);
    report.concKey = keyOf('t-conc');

    const many = [];
    for (let i = 0; i < 20; i++) {
        many.push(req(c, { operation: `t-many-${i}`, path: '/tickets', body: { i } }));
    }
    report.many = await Promise.all(many);
}

async function conflicts(c) {
    report.conf1 = await req(c, { operation: 't-conf', path: '/tickets', body: { v: 1 } });
    report.conf2 = await req(c, { operation: 't-conf', path: '/tickets', body: { v: 2 } });
    const k1 = report.conf1.structuredContent && report.conf1.structuredContent.idempotency_key;
    report.confTrue = await req(c, { operation: 't-conf', path: '/tickets', body: { v: 2 }, new_operation: true });
    const k2 = report.confTrue.structuredContent && report.confTrue.structuredContent.idempotency_key;
    report.confBad = await req(c, { operation: 't-conf', path: '/tickets', body: { v: 3 }, new_operation: 'yes' });
    report.conf3 = await req(c, { operation: 't-conf', path: '/tickets', body: { v: 3 }, new_operation: k2 });
    // the host retries the same call (it timed out on its side): the new action resumes
    report.conf4 = await req(c, { operation: 't-conf', path: '/tickets', body: { v: 3 }, new_operation: k2 });
}

async function confirmation(c) {
    const args = { operation: 'p-1', path: '/pay', body: { amount: 4200, to: 'ACME Ltd' } };
    report.confirm1 = await req(c, args);
    const p = report.confirm1.structuredContent && report.confirm1.structuredContent.proposal;
    fs.writeFileSync(`${E.MCP_STATE_DIR}/../proposal.json`, JSON.stringify({ proposal: p }));
    try {
        report.approveOut = execFileSync(E.MCP_APPROVE, ['--endpoint', `${E.MCP_BASE}/approve`, '--status', `${E.MCP_BASE}/idempotency/status`,
            '--sub', 'alice', '--yes', `${E.MCP_STATE_DIR}/../proposal.json`],
            { stdio: ['ignore', 'pipe', 'ignore'] }).toString();
    } catch (e) { report.approveOut = `failed: ${e.message}`; }
    report.confirm2 = await req(c, args);
    report.confirm3 = await req(c, args);
}

// a holder of deploy:production (another key), then the call waits it out;
// an operation in progress in another server process is waited out too
async function waits(c) {
    const hk = `holder-${process.pid}`;
    const holder = fetch(`${E.MCP_BASE}/deployments`, { method: 'POST',
        headers: { 'Idempotency-Key': hk, 'Content-Type': 'application/json', 'X-Delay': '2.5',
                   Authorization: 'Bearer holder' },
        body: JSON.stringify({ environment: 'production', id: 'dep-1' }) });
    await until(() => effectsFor(hk) === 1, 10000);
    report.lock = await req(c, { operation: 'd-2', path: '/deployments',
        body: { environment: 'production', id: 'dep-2' } });
    report.holderStatus = (await holder).status;
    report.holderKey = hk;

    const other = await connect();
    const first = req(other.c, { operation: 't-ip', path: '/tickets', body: { title: 'ip' },
        headers: { 'X-Delay': '1.5' } });
    await until(() => effectsFor(keyOf('t-ip')) === 1, 10000);
    report.inprog = await req(c, { operation: 't-ip', path: '/tickets', body: { title: 'ip' },
        headers: { 'X-Delay': '1.5' } });
    report.inprogFirst = await first;
    await other.c.close();

    report.unknown = await req(c, { operation: 't-unk', path: '/tickets', body: { title: 'u' },
        headers: { 'X-Drop': '1' } });
}

// kill -9 of the server during a call; a new server, the same call
async function killed() {
    const a = await connect();
    const args = { operation: 't-kill', path: '/tickets', body: { title: 'k' }, headers: { 'X-Delay': '2' } };
    const lost = req(a.c, args);
    report.killDuring = await until(() => effectsFor(keyOf('t-kill')) === 1, 10000);
    process.kill(a.t.pid, 'SIGKILL');
    report.killFirst = await lost;
    const b = await connect();
    report.killAgain = await req(b.c, args);
    report.killKey = keyOf('t-kill');
    await b.c.close();
    try { await a.c.close(); } catch (e) { /* already gone */ }
}

async function refusals(c) {
    const r = {};
    r.outside = await req(c, { operation: 'r-1', path: '/admin/users', body: {} });
    r.dotdot = await req(c, { operation: 'r-2', path: '/tickets/../admin', body: {} });
    r.absolute = await req(c, { operation: 'r-3', path: 'http://evil.example/tickets', body: {} });
    r.hostpath = await req(c, { operation: 'r-4', path: '//evil.example/tickets', body: {} });
    r.authHeader = await req(c, { operation: 'r-5', path: '/tickets', body: {}, headers: { Authorization: 'Bearer x' } });
    r.keyHeader = await req(c, { operation: 'r-6', path: '/tickets', body: {}, headers: { 'idempotency-key': 'k' } });
    r.unknownTarget = await call(c, 'idempotent_request', { operation: 'r-7', target: 'nope', path: '/tickets' });
    r.method = await req(c, { operation: 'r-8', path: '/tickets', method: 'DELETE', body: {} });
    r.wrongType = await call(c, 'idempotent_request', { operation: 5, target: 'api', path: '/tickets' });
    r.unknownTool = await call(c, 'no_such_tool', {});
    r.badOp = await req(c, { operation: '../etc', path: '/tickets', body: {} });
    r.dotdotParam = await req(c, { operation: 'r-9', path: '/tickets/..;/admin/users', body: {} });
    r.dotParam = await req(c, { operation: 'r-10', path: '/tickets/.;x/admin/users', body: {} });
    r.escDot = await req(c, { operation: 'r-11', path: '/tickets/%2E%2e/admin/users', body: {} });
    r.escSlash = await req(c, { operation: 'r-12', path: '/tickets/..%2fadmin/users', body: {} });
    r.escBackslash = await req(c, { operation: 'r-13', path: '/tickets/..%5cadmin/users', body: {} });
    r.escPercent = await req(c, { operation: 'r-14', path: '/tickets/%252e%252e/admin/users', body: {} });
    r.backslash = await req(c, { operation: 'r-15', path: '/tickets\\..\\admin/users', body: {} });
    r.noBoundary = await req(c, { operation: 'r-16', path: '/tickets-admin/users', body: {} });
    r.overrideHeader = await req(c, { operation: 'r-17', path: '/tickets', body: {},
        headers: { 'x-http-method-override': 'DELETE' } });
    r.forwardedHeader = await req(c, { operation: 'r-18', path: '/tickets', body: {},
        headers: { 'X-Forwarded-Host': 'admin.internal' } });
    r.originalUrl = await req(c, { operation: 'r-19', path: '/tickets', body: {},
        headers: { 'X-Original-URL': '/admin/users' } });
    r.statusOtherTarget = await call(c, 'operation_status', { operation: 't-created', target: 'other' });
    report.refusals = r;
    report.pingAfterRefusals = JSON.stringify(await c.ping());
}

// a server on raw stdio, without the SDK: its process and the lines it
// writes to stdout, as they come
function rawServer() {
    const p = spawn(E.MCP_BIN, ['--config', E.MCP_CONFIG], { env: { MCP_TEST_TOKEN: E.MCP_TEST_TOKEN },
        stdio: ['pipe', 'pipe', 'pipe'] });
    p.stderr.pipe(stderrLog, { end: false });
    let buf = '';
    const lines = [];
    p.stdout.on('data', (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) { lines.push(buf.slice(0, i)); buf = buf.slice(i + 1); }
    });
    return { p, lines };
}

// malformed JSON-RPC on raw stdio (the SDK sends only valid messages);
// each line is followed by a ping, whose answer must come
async function malformed() {
    const { p, lines } = rawServer();
    const big = '{"jsonrpc":"2.0","id":99,"method":"ping","params":{"x":"' + 'a'.repeat(10 * 1024 * 1024) + '"}}';
    const bad = ['garbage', '[]', '[{"jsonrpc":"2.0","id":1,"method":"ping"}]', '{"jsonrpc":"1.0","id":2,"method":"ping"}',
        '{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}', '{"jsonrpc":"2.0","id":4,"method":5}',
        '{"jsonrpc":"2.0","id":5,"method":"tools/call","params":[1]}',
        '{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":7}}',
        '{"jsonrpc":"2.0","id":7,"method":"no/such/method"}', '{"jsonrpc":"2.0","id":8', '\u0000\u0001',
        big];
    report.malformed = [];
    let n = 1000;
    for (const l of bad) {
        const before = lines.length;
        p.stdin.write(l + '\n');
        p.stdin.write(JSON.stringify({ jsonrpc: '2.0', id: ++n, method: 'ping' }) + '\n');
        await until(() => lines.slice(before).some((x) => x.includes(`"id":${n}`)), 20000);
        const got = lines.slice(before).map((x) => { try { return JSON.parse(x); } catch (e) { return { unparsable: x }; } });
        report.malformed.push({ sent: l.length > 200 ? `${l.slice(0, 60)}... (${l.length} bytes)` : l, got });
    }
    p.stdin.end();
    report.malformedExit = await new Promise((r) => p.on('exit', (code, sig) => r({ code, sig })));
}

// numbers JavaScript cannot hold (2^53 + 1, 1e400) on raw stdio: the SDK
// would round them before sending
async function lossy() {
    const { p, lines } = rawServer();
    p.stdin.write('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
        + '"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}\n');
    p.stdin.write('{"jsonrpc":"2.0","method":"notifications/initialized"}\n');
    const bodies = { big: '{"n":9007199254740993}', neg: '{"a":[{"n":-1e300}]}', inf: '{"x":1e400}',
        max: '{"n":9007199254740991,"f":0.1}', exact: '{"n":9007199254740992}' };
    report.lossy = {};
    let id = 10;
    for (const [name, body] of Object.entries(bodies)) {
        const n = ++id;
        p.stdin.write(`{"jsonrpc":"2.0","id":${n},"method":"tools/call","params":{"name":"idempotent_request",`
            + `"arguments":{"operation":"n-${name}","target":"api","path":"/tickets","body":${body}}}}\n`);
        await until(() => lines.some((x) => x.includes(`"id":${n}`)), 30000);
        const l = lines.find((x) => x.includes(`"id":${n}`));
        report.lossy[name] = l ? JSON.parse(l).result : null;
    }
    p.stdin.end();
    await new Promise((r) => p.on('exit', r));
}

// notifications/cancelled (the SDK sends it on abort) stops the wait; the key
// stays, and the same call later gets the one execution's answer
async function cancelled(c) {
    const args = { operation: 't-cancel', path: '/tickets', body: { title: 'x' }, headers: { 'X-Delay': '3' } };
    const ac = new AbortController();
    const p = req(c, args, { signal: ac.signal });
    await until(() => effectsFor(keyOf('t-cancel')) === 1, 10000);
    ac.abort('the user changed their mind');
    report.cancelFirst = await p;
    report.cancelPing = JSON.stringify(await c.ping());
    report.cancelKey = keyOf('t-cancel');
    report.cancelAgain = await req(c, args);
}

// an operation begun by idempotency-call is finished here, and the other way
async function shared(c) {
    report.sharedMcp = await req(c, { operation: 'x-shared', path: '/tickets', body: { title: 'shared' } });
    report.sharedMcp2 = await req(c, { operation: 'x-shared2', path: '/tickets', body: { title: 'shared2' } });
}

const steps = { versions, versionsClient, basics, cancelled, shared, concurrency, conflicts, confirmation, waits, killed, refusals, malformed, lossy };

async function main() {
    const only = (E.MCP_STEPS || Object.keys(steps).join(',')).split(',');
    const { c } = await connect();
    for (const s of only) {
        try {
            await (['versions', 'versionsClient', 'killed', 'malformed', 'lossy'].includes(s) ? steps[s]() : steps[s](c));
        } catch (e) {
            report[`error_${s}`] = String(e && e.stack || e);
        }
    }
    await c.close();
    fs.writeFileSync(E.MCP_REPORT, JSON.stringify(report));
    stderrLog.end();
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
