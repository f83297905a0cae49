// A small Markdown renderer for replies: everything is escaped first, then a few constructs are recognised
// (fenced code blocks, inline code, headings, lists, quotes, bold, italic, links to http(s) and mailto).
// No raw HTML from a message ever reaches the page.
"use strict";

(function () {
  const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escape = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);

  function inline(text) {
    // Code spans are cut out first so nothing inside them is interpreted.
    const spans = [];
    let s = text.replace(/`([^`\n]+)`/g, (_, code) => {
      spans.push("<code>" + escape(code) + "</code>");
      return "\u0000" + (spans.length - 1) + "\u0000";
    });
    s = escape(s);
    s = s.replace(/\[([^\]\n]+)\]\(((?:https?:\/\/|mailto:)[^\s)]+)\)/g,
      (_, label, href) => `<a href="${href}" rel="noopener noreferrer" target="_blank">${label}</a>`);
    s = s.replace(/(^|[\s(])((?:https?:\/\/)[^\s<)]+[^\s<).,;:!?'"])/g,
      (_, pre, href) => `${pre}<a href="${href}" rel="noopener noreferrer" target="_blank">${href}</a>`);
    s = s.replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>");
    s = s.replace(/__([^_\n]+)__/g, "<strong>$1</strong>");
    s = s.replace(/(^|[^*\w])\*([^*\s][^*\n]*?)\*(?!\w)/g, "$1<em>$2</em>");
    s = s.replace(/(^|[^_\w])_([^_\s][^_\n]*?)_(?!\w)/g, "$1<em>$2</em>");
    s = s.replace(/~~([^~\n]+)~~/g, "<del>$1</del>");
    return s.replace(/\u0000(\d+)\u0000/g, (_, n) => spans[Number(n)]);
  }

  function render(source) {
    const lines = String(source ?? "").replace(/\r\n?/g, "\n").split("\n");
    const out = [];
    let para = [];
    let list = null; // { tag, items }
    const flushPara = () => {
      if (para.length) out.push("<p>" + para.map(inline).join("<br>") + "</p>");
      para = [];
    };
    const flushList = () => {
      if (list) out.push(`<${list.tag}>` + list.items.map((i) => "<li>" + inline(i) + "</li>").join("") + `</${list.tag}>`);
      list = null;
    };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/);
      if (fence) {
        flushPara(); flushList();
        const code = [];
        i++;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) code.push(lines[i++]);
        const lang = fence[2] ? ` data-lang="${escape(fence[2])}"` : "";
        const label = fence[2] ? `<span class="code-lang">${escape(fence[2])}</span>` : "";
        out.push(`<pre${lang}>${label}<code>${escape(code.join("\n"))}</code></pre>`);
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      if (heading) {
        flushPara(); flushList();
        const level = Math.min(6, heading[1].length + 2); // replies sit under the page's own headings
        out.push(`<h${level} class="md-h">${inline(heading[2])}</h${level}>`);
        continue;
      }
      const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
      const numbered = line.match(/^\s*\d+[.)]\s+(.*)$/);
      if (bullet || numbered) {
        flushPara();
        const tag = bullet ? "ul" : "ol";
        if (!list || list.tag !== tag) { flushList(); list = { tag, items: [] }; }
        list.items.push((bullet || numbered)[1]);
        continue;
      }
      const quote = line.match(/^>\s?(.*)$/);
      if (quote) {
        flushPara(); flushList();
        out.push("<blockquote>" + inline(quote[1]) + "</blockquote>");
        continue;
      }
      if (!line.trim()) { flushPara(); flushList(); continue; }
      if (list) flushList();
      para.push(line);
    }
    flushPara(); flushList();
    return out.join("");
  }

  window.renderMarkdown = render;
  window.escapeHtml = escape;
})();
