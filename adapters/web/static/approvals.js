// Agents asking before a tool runs ([agents.X] permission_mode = "ask"): the question in a chat with Allow /
// Deny / Allow for this chat, and the Operations list of every request still waiting. A press is an
// operator's answer (POST /api/approvals/{id}); the chat the request came from is told what became of it.
// It uses app.js's helpers ($, el, api, ago, duration, agentName, showError, showNotice, openChat, showView,
// refreshHistory, state), loaded before it.
"use strict";

const APPROVAL_CHOICES = [
  ["allow", "Allow", "primary"],
  ["deny", "Deny", "danger"],
  ["allow_chat", "Allow for this chat", ""],
];

// A chat's questions by request id → the later reply saying what became of each (null while it waits). The
// chat shows a question with that answer in its place, as a platform edits the question, and leaves out the
// answer's own reply when its question is on screen.
function approvalsAsked(items) {
  const asked = new Map();
  for (const i of items) if (i.kind === "reply" && i.note === "approval" && i.approvalId) asked.set(i.approvalId, null);
  for (const i of items) {
    if (i.kind === "reply" && i.note === "approval_closed" && asked.has(i.approvalId)) asked.set(i.approvalId, i);
  }
  return asked;
}

// The requests answered from this page and not yet settled: a refresh while the answer is on its way draws
// their buttons disabled, so a second press cannot race the first.
const answering = new Set();

// The buttons answering request `id`; `done(text, ok)` follows the answer (`text`: what the server said).
// A request asked in no chat (a scheduled run) has no "Allow for this chat".
function approvalButtons(id, what, done, inChat = true) {
  const row = el("div", { class: "approval-actions", role: "group", "aria-label": "Answer: " + what });
  for (const [decision, label, cls] of APPROVAL_CHOICES) {
    if (decision === "allow_chat" && !inChat) continue;
    const button = el("button", { type: "button", class: cls, "data-decision": decision, disabled: answering.has(id) }, label);
    button.addEventListener("click", () => answerApproval(id, decision, row, done));
    row.append(button);
  }
  return row;
}

async function answerApproval(id, decision, row, done) {
  for (const b of row.querySelectorAll("button")) b.disabled = true;
  answering.add(id);
  let text;
  let ok = true;
  try {
    text = (await api("POST", `/api/approvals/${encodeURIComponent(id)}`, { decision })).text;
  } catch (e) {
    ok = false;
    text = e.message; // "This request was already answered: …", "This request has expired."
  }
  try { await done(text, ok); } finally { answering.delete(id); }
}

// In the chat: the buttons under a question that still waits. The answer shows in the question's place once
// the history is read again; a refusal (answered meanwhile, expired) is said in the chat's notice line.
function chatApprovalButtons(item) {
  return approvalButtons(item.approvalId, "the question above", async (text, ok) => {
    if (!ok) showNotice(text);
    await refreshHistory().catch(() => {});
  });
}

function timeLeft(expiresAt) {
  const left = expiresAt - Date.now();
  return left > 0 ? duration(left) + " left" : "time is up";
}

function whereAsked(a) {
  if (!a.channel) return el("span", {}, "no chat (a scheduled run: only an operator can answer)");
  const who = a.sender && a.sender !== "web" ? a.sender : a.sender_id;
  const open = el("button", { type: "button", class: "link" }, a.channel === "web" ? "web chat" : `chat on ${a.channel}`);
  open.addEventListener("click", () => { showView("chat"); openChat(a.channel, a.conversation); });
  return el("span", {}, open, who ? ` · ${who}` : "");
}

// The Operations list: every request still waiting, oldest first, with the same buttons.
async function refreshApprovals() {
  const rows = await api("GET", "/api/approvals");
  const list = $("#approval-list");
  list.replaceChildren(...rows.map((a) => {
    const what = `${a.tool} for @${a.agent}`;
    const done = async (text, ok) => {
      showError("#approval-error", ok ? null : new Error(text));
      await refreshApprovals().catch(() => {});
    };
    return el("li", { class: "approval", "data-id": a.id },
      el("div", { class: "approval-top" },
        el("span", {}, el("b", { class: "agent-name" }, agentName(a.agent)), " asks to use ", el("b", {}, a.tool)),
        approvalButtons(a.id, what, done, Boolean(a.channel))),
      el("pre", { class: "approval-what", tabIndex: 0 }, a.summary || a.command),
      el("div", { class: "hint" }, whereAsked(a), ` · waiting since ${clock(a.created_at)} · `,
        el("span", { class: "time-left", "data-expires": String(a.expires_at) }, timeLeft(a.expires_at))));
  }));
  if (!rows.length) list.replaceChildren(el("li", { class: "empty" }, "No agent is waiting for an answer."));
}

// The time left ticks between refreshes.
setInterval(() => {
  if (state.view !== "ops") return;
  for (const span of document.querySelectorAll("#approval-list .time-left")) {
    span.textContent = timeLeft(Number(span.dataset.expires));
  }
}, 1000);
