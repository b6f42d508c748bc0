#!/usr/bin/env node
// The approval page in a real headless Chromium (Debian's), driven by
// t/76-approve-page.t: each command opens the page as the approver (HTTP
// basic credentials), does what a person (or an attacker's page) would
// do, and prints what the browser saw as one JSON object on stdout. The
// Perl test checks it, with the upstream's effect counts.
//
//   view URL [SHOTDIR]           what the page shows (screenshots at 390
//                                and 1280 px wide into SHOTDIR)
//   decide URL approve|decline   press the button with the keyboard
//   evil URL                     a page on another loopback port posts the
//                                real form (a real token) to the page
//   swap URLA URLB               A's token in B's form, then Approve
//   stale URL WAITFILE           keep the form open until WAITFILE exists
//                                (the proposal has expired by then), open
//                                the page again, then press Approve anyway
//   twice URL                    two tabs: Approve in one, then Decline
//                                with the other's (replayed) form
//   list URL                     the pending operations the list shows

'use strict';

const fs = require('fs');
const http = require('http');
const os = require('os');
const path = require('path');
const { chromium } = require('playwright-core');

const USER = process.env.IDEM_APPROVER || 'alice';
const PASS = process.env.IDEM_PASSWORD || 'secret';

async function browser() {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-chromium-'));
    const ctx = await chromium.launchPersistentContext(dir, {
        executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
        headless: true,
        args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
               '--no-first-run', '--disable-background-networking',
               '--disable-component-update', '--disable-sync'],
        httpCredentials: { username: USER, password: PASS },
        viewport: { width: 1280, height: 900 },
    });
    return { ctx, dir };
}

async function close(b) {
    await b.ctx.close();
    fs.rmSync(b.dir, { recursive: true, force: true });
}

// what a person sees: the text of each labelled row, the buttons
async function seen(page) {
    return page.evaluate(() => {
        const rows = {};
        document.querySelectorAll('dl dt').forEach((dt) => {
            rows[dt.textContent] = dt.nextElementSibling.textContent;
        });
        const text = (sel) => {
            const e = document.querySelector(sel);
            return e ? e.textContent : null;
        };
        return {
            title: document.title,
            h1: text('h1'),
            describe: text('#describe'),
            state: text('#state'),
            why: text('#why'),
            who: text('#who'),
            result: text('#result'),
            rows,
            ttls: Array.from(document.querySelectorAll('select[name=ttl] option')).map((o) => o.value),
            approve: !!document.querySelector('button#approve'),
            decline: !!document.querySelector('button#decline'),
            images: document.querySelectorAll('img').length,
            scripts: document.querySelectorAll('script').length,
            text: document.body ? document.body.innerText : '',
        };
    });
}

async function open(b, url) {
    const page = await b.ctx.newPage();
    const resp = await page.goto(url);
    return { page, resp };
}

async function headers(resp) {
    const h = await resp.allHeaders();
    return { status: resp.status(), headers: h };
}

async function view(url, shots) {
    const b = await browser();
    const { page, resp } = await open(b, url);
    const out = { ...(await headers(resp)), ...(await seen(page)) };
    if (shots) {
        fs.mkdirSync(shots, { recursive: true });
        for (const w of [390, 1280]) {
            await page.setViewportSize({ width: w, height: 900 });
            const file = path.join(shots, `approve-page-${w}.png`);
            await page.screenshot({ path: file, fullPage: true });
            out[`shot${w}`] = file;
            // nothing may be wider than the window: values wrap, never cut
            out[`overflow${w}`] = await page.evaluate(
                () => document.documentElement.scrollWidth > window.innerWidth);
        }
    }
    await close(b);
    return out;
}

// the keyboard alone: Tab until the button has the focus, then Enter
async function press(page, id) {
    for (let i = 0; i < 40; i++) {
        await page.keyboard.press('Tab');
        const f = await page.evaluate(() => document.activeElement && document.activeElement.id);
        if (f === id) {
            const nav = page.waitForNavigation();
            await page.keyboard.press('Enter');
            const resp = await nav;
            return resp;
        }
    }
    throw new Error(`no focusable #${id}`);
}

async function decide(url, what) {
    const b = await browser();
    const { page } = await open(b, url);
    const resp = await press(page, what);
    const out = { ...(await headers(resp)), ...(await seen(page)) };
    await close(b);
    return out;
}

async function form(page) {
    return page.evaluate(() => {
        const f = {};
        document.querySelectorAll('form input').forEach((i) => { f[i.name] = i.value; });
        return f;
    });
}

// another origin (a loopback port of its own) with the page's real form
async function evil(url) {
    const b = await browser();
    const { page } = await open(b, url);
    const f = await form(page);
    const inputs = Object.entries({ ...f, decision: 'approve', ttl: '300' })
        .map(([k, v]) => `<input type="hidden" name="${k}" value="${v}">`).join('');
    const html = `<!DOCTYPE html><title>cute cats</title><form id="f" method="post" `
        + `action="${url}">${inputs}<button id="go">Free cats</button></form>`;
    const srv = http.createServer((q, s) => { s.setHeader('Content-Type', 'text/html'); s.end(html); });
    await new Promise((r) => srv.listen(0, '127.0.0.1', r));
    const other = await b.ctx.newPage();
    await other.goto(`http://127.0.0.1:${srv.address().port}/`);
    const nav = other.waitForNavigation();
    await other.click('#go');
    const resp = await nav;
    const out = { ...(await headers(resp)), ...(await seen(other)) };
    srv.close();
    await close(b);
    return out;
}

async function swap(urlA, urlB) {
    const b = await browser();
    const a = await open(b, urlA);
    const fa = await form(a.page);
    const { page } = await open(b, urlB);
    await page.evaluate((t) => { document.querySelector('input[name=token]').value = t; }, fa.token);
    const resp = await press(page, 'approve');
    const out = { ...(await headers(resp)), ...(await seen(page)) };
    await close(b);
    return out;
}

async function stale(url, waitfile) {
    const b = await browser();
    const { page } = await open(b, url);
    const before = await seen(page);
    while (!fs.existsSync(waitfile)) {
        await new Promise((r) => setTimeout(r, 100));
    }
    const again = await open(b, url);
    const after = await seen(again.page);
    const resp = await press(page, 'approve');
    const out = { before, after, posted: { ...(await headers(resp)), ...(await seen(page)) } };
    await close(b);
    return out;
}

// two tabs of one page: Approve in the first, then the second's form (a
// valid token, replayed after the decision) tries Decline
async function twice(url) {
    const b = await browser();
    const one = await open(b, url);
    const two = await open(b, url);
    const first = await press(one.page, 'approve');
    const a = { ...(await headers(first)), ...(await seen(one.page)) };
    const second = await press(two.page, 'decline');
    const d = { ...(await headers(second)), ...(await seen(two.page)) };
    await close(b);
    return { first: a, second: d };
}

async function list(url) {
    const b = await browser();
    const { page, resp } = await open(b, url);
    const out = await headers(resp);
    out.ops = await page.evaluate(() => Array.from(document.querySelectorAll('#pending a'))
        .map((a) => new URL(a.href).searchParams.get('op')));
    out.none = await page.evaluate(() => !!document.querySelector('#none'));
    await close(b);
    return out;
}

async function main() {
    const [cmd, ...args] = process.argv.slice(2);
    const cmds = { view, decide, evil, swap, stale, twice, list };
    if (!cmds[cmd]) {
        throw new Error(`unknown command ${cmd}`);
    }
    process.stdout.write(JSON.stringify(await cmds[cmd](...args)) + '\n');
}

main().catch((e) => { process.stderr.write(`${e.stack || e}\n`); process.exit(1); });
