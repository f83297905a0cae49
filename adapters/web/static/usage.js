// The dashboard's costs view: what agent runs cost today and this month per agent, the top senders, a chart
// of the last 14 days, and who is over a [budgets] limit. Everything comes from GET /api/usage (the sums
// `agentpost usage` prints) and GET /api/usage/budgets; days and months are UTC, as budgets count them.
// It uses app.js's helpers ($, el, api, duration, agentName, state), loaded before it.
"use strict";

const CHART_DAYS = 14;
const TOP_SENDERS = 10;
const SVG_NS = "http://www.w3.org/2000/svg";

// Dollars as agentpost writes them everywhere (shared/reads/usage.py usd): cents from a dollar up, four places
// below, since a short run costs about a cent.
function usd(amount) {
  const n = Number(amount) || 0;
  return "$" + (n >= 1 ? n.toFixed(2) : n.toFixed(4));
}

function byKey(rows) {
  return new Map(rows.map((r) => [r.key, r]));
}

// The UTC dates of the last `n` days, oldest first, as the API names days ("YYYY-MM-DD").
function lastDays(n) {
  const today = new Date();
  const base = Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate());
  const days = [];
  for (let i = n - 1; i >= 0; i--) days.push(new Date(base - i * 86400000).toISOString().slice(0, 10));
  return days;
}

function q(params) {
  return "/api/usage?" + new URLSearchParams(params).toString();
}

async function refreshUsage() {
  // The chart asks for one day more than it shows: "14d" reaches back into a day it would show only in part.
  const [agentsToday, agentsMonth, sendersToday, sendersMonth, days, ever, budgets] = await Promise.all([
    api("GET", q({ by: "agent", since: "today" })),
    api("GET", q({ by: "agent", since: "month" })),
    api("GET", q({ by: "sender", since: "today" })),
    api("GET", q({ by: "sender", since: "month" })),
    api("GET", q({ by: "day", since: CHART_DAYS + "d" })),
    api("GET", q({ by: "agent", since: "all" })),
    api("GET", "/api/usage/budgets"),
  ]).catch((e) => { showError("#usage-error", e); throw e; });
  showError("#usage-error", null);
  renderBudgets(budgets);
  $("#usage-empty").hidden = ever.length > 0;
  renderAgentCosts(agentsToday, agentsMonth);
  renderSenderCosts(sendersToday, sendersMonth);
  renderDayChart(days);
}

// The tab's badge: how many are over a limit, seen from any view. Limits reset at midnight and spending
// grows a run at a time, so every other view asks at most every 15 s rather than on each event.
let overCheckedAt = 0;
async function refreshOverBadge() {
  if (Date.now() - overCheckedAt < 15000) return;
  overCheckedAt = Date.now();
  renderOverBadge(await api("GET", "/api/usage/budgets"));
}

function renderOverBadge(budgets) {
  const badge = $("#over-badge");
  const n = budgets.over.length;
  badge.textContent = n ? `${n} over budget` : "";
  badge.hidden = !n;
}

function overText(o) {
  const who = o.whose === "agent" ? `Agent @${o.who}` : `Sender ${o.who}`;
  const scope = o.agents.length ? ` (for ${o.agents.map((a) => "@" + a).join(", ")})` : "";
  return `${who}${scope} has spent ${usd(o.spent_usd)} of the ${o.period} limit of ${usd(o.limit_usd)}.`;
}

function resetsText(ms) {
  const d = new Date(ms);
  const first = d.getUTCDate() === 1;
  const when = first ? d.toLocaleDateString([], { month: "long", day: "numeric", timeZone: "UTC" }) + ", 00:00 UTC"
    : "midnight UTC";
  return `Resets ${when} (in ${duration(ms - Date.now())}).`;
}

function renderBudgets(budgets) {
  renderOverBadge(budgets);
  const card = $("#budgets");
  const over = budgets.over;
  card.classList.toggle("alert", over.length > 0);
  let text;
  if (over.length) {
    text = "Messages from or for these are not run until the limit resets or is raised ([budgets] in settings.toml); the sender is told why.";
  } else if (budgets.limits_set) {
    text = "No one is over budget.";
  } else {
    text = "No budgets are set. Add [budgets] to settings.toml to cap what a person or an agent can spend per day or month.";
  }
  $("#budgets-state").textContent = text;
  $("#over-list").replaceChildren(...over.map((o) => el("li", { "data-who": o.who, "data-period": o.period },
    el("b", {}, overText(o)), " ", el("span", { class: "hint" }, resetsText(o.resets_at) + " Setting: " + o.setting + "."))));
}

function costRow(label, id, dataKey, todayRow, monthRow) {
  return el("tr", { [dataKey]: id },
    el("th", { scope: "row" }, label),
    el("td", { class: "num today", "data-label": "Today" }, usd(todayRow ? todayRow.cost_usd : 0)),
    el("td", { class: "num month", "data-label": "This month" }, usd(monthRow ? monthRow.cost_usd : 0)),
    el("td", { class: "num runs", "data-label": "Runs this month" }, String(monthRow ? monthRow.runs : 0)));
}

function renderAgentCosts(todayRows, monthRows) {
  const today = byKey(todayRows);
  const month = byKey(monthRows);
  const ids = new Set([...Object.keys(state.agents), ...month.keys()]);
  const cost = (id) => (month.get(id) || { cost_usd: 0 }).cost_usd;
  const sorted = [...ids].sort((a, b) => cost(b) - cost(a) || a.localeCompare(b));
  const rows = sorted.map((id) => {
    const name = agentName(id);
    const label = name !== id ? [name, el("span", { class: "handle" }, " @" + id)] : "@" + id;
    return costRow(label, id, "data-agent", today.get(id), month.get(id));
  });
  const body = $("#agent-cost tbody");
  body.replaceChildren(...rows);
  if (!rows.length) body.replaceChildren(el("tr", {}, el("td", { colSpan: 4, class: "empty" }, "No agents yet.")));
}

function renderSenderCosts(todayRows, monthRows) {
  const today = byKey(todayRows);
  const top = monthRows.filter((r) => r.key).slice(0, TOP_SENDERS);
  const body = $("#sender-cost tbody");
  body.replaceChildren(...top.map((r) => costRow(r.key, r.key, "data-sender", today.get(r.key), r)));
  if (!top.length) body.replaceChildren(el("tr", {}, el("td", { colSpan: 4, class: "empty" }, "No one has sent a message that ran this month.")));
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

// A bar per UTC day, drawn at the width the card has (so its text stays legible on a phone); each bar's
// <title> gives the day's exact figure.
function renderDayChart(rows) {
  const box = $("#day-chart");
  const found = byKey(rows);
  const days = lastDays(CHART_DAYS).map((d) => found.get(d) || { key: d, runs: 0, cost_usd: 0 });
  const total = days.reduce((sum, d) => sum + d.cost_usd, 0);
  const max = Math.max(...days.map((d) => d.cost_usd));
  box.dataset.days = JSON.stringify(days.map((d) => [d.key, d.cost_usd]));
  const width = Math.max(280, box.clientWidth || 600);
  const height = 190;
  const left = 62;
  const bottom = 34;
  const top = 12;
  const plotW = width - left - 6;
  const plotH = height - top - bottom;
  const step = plotW / days.length;
  const scale = max > 0 ? max : 1;
  const label = `Cost per day over the last ${CHART_DAYS} days (UTC): ${usd(total)} in all` +
    (max > 0 ? `, at most ${usd(max)} in a day.` : ", nothing spent.");
  const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label, class: "chart" },
    svg("title", {}, label));
  for (const frac of [0, 0.5, 1]) {
    const y = top + plotH - frac * plotH;
    chart.append(svg("line", { x1: left, x2: width - 6, y1: y, y2: y, class: "grid" }),
      svg("text", { x: left - 6, y: y + 4, "text-anchor": "end", class: "axis" }, max > 0 ? usd(frac * max) : frac ? "" : "$0"));
  }
  const every = step < 22 ? 2 : 1;
  days.forEach((d, i) => {
    const h = (d.cost_usd / scale) * plotH;
    const x = left + i * step + step * 0.15;
    const bar = svg("rect", { x, y: top + plotH - h, width: step * 0.7, height: Math.max(h, d.cost_usd > 0 ? 1 : 0), class: "bar", "data-day": d.key },
      svg("title", {}, `${d.key}: ${usd(d.cost_usd)} (${d.runs} run${d.runs === 1 ? "" : "s"})`));
    chart.append(bar);
    if ((days.length - 1 - i) % every === 0) {
      const date = new Date(d.key + "T00:00:00Z");
      const text = i === 0 || date.getUTCDate() === 1 || i === days.length - 1
        ? date.toLocaleDateString([], { month: "short", day: "numeric", timeZone: "UTC" }) : String(date.getUTCDate());
      chart.append(svg("text", { x: left + i * step + step / 2, y: height - bottom + 16, "text-anchor": "middle", class: "axis" }, text));
    }
  });
  box.replaceChildren(chart, el("p", { class: "hint" }, `${usd(total)} over these ${CHART_DAYS} days.`));
}

// The chart is drawn to the card's width: draw it again when that changes.
let chartWidth = 0;
window.addEventListener("resize", () => {
  const box = $("#day-chart");
  if (!box || !box.dataset.days || box.clientWidth === chartWidth) return;
  chartWidth = box.clientWidth;
  if (state.view === "usage") refreshUsage().catch(() => {});
});
