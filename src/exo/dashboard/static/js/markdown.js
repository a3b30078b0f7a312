// Markdown as chat models write it, turned into DOM nodes (never HTML strings, so a reply's "<script>" or
// "<img onerror>" is shown as text): fenced code blocks (an unclosed fence, as while a reply streams, runs to the
// end), headings, paragraphs, lists (nested by indentation), block quotes, tables, rules, and inline code, bold,
// italic, strikethrough and links. Only http(s) and mailto links are made; images are shown as links to them, so
// the page never fetches anything a reply names.
import { h } from "./dom.js";

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])(?: +(.*))?$/;
const TABLE_SEPARATOR = /^ *\|? *:?-+:? *(?:\| *:?-+:? *)*\|? *$/;
const SAFE_LINK = /^(?:https?:|mailto:)/i;

export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  fragment.append(...blocks(text.replace(/\r\n?/g, "\n").split("\n")));
  return fragment;
}

function blocks(lines) {
  const out = [];
  let index = 0;
  while (index < lines.length) {
    const line = lines[index];
    let match;
    if (line.trim() === "") {
      index += 1;
    } else if ((match = FENCE.exec(line))) {
      const fence = match[1];
      const body = [];
      index += 1;
      while (index < lines.length && !lines[index].trim().startsWith(fence)) body.push(lines[index++]);
      index += 1;
      out.push(codeBlock(body.join("\n"), match[2]));
    } else if ((match = HEADING.exec(line))) {
      out.push(h(`h${Math.min(match[1].length + 2, 6)}`, { class: "md-heading" }, inline(match[2])));
      index += 1;
    } else if (RULE.test(line)) {
      out.push(h("hr"));
      index += 1;
    } else if (QUOTE.test(line)) {
      const quoted = [];
      while (index < lines.length && (match = QUOTE.exec(lines[index]))) {
        quoted.push(match[1]);
        index += 1;
      }
      out.push(h("blockquote", {}, blocks(quoted)));
    } else if (ITEM.test(line)) {
      index = list(lines, index, out);
    } else if (line.includes("|") && index + 1 < lines.length && TABLE_SEPARATOR.test(lines[index + 1])
      && lines[index + 1].includes("-")) {
      index = table(lines, index, out);
    } else {
      const paragraph = [];
      while (index < lines.length && lines[index].trim() !== "" && !startsBlock(lines[index])) {
        paragraph.push(lines[index++].trim());
      }
      if (paragraph.length === 0) paragraph.push(lines[index++].trim());
      out.push(h("p", {}, inline(paragraph.join("\n"))));
    }
  }
  return out;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

function codeBlock(code, language) {
  const copy = h("button", { type: "button", class: "copy", "aria-label": `Copy ${language || "code"}` }, "Copy");
  copy.addEventListener("click", () => copyText(code).then(
    () => { copy.textContent = "Copied"; },
    () => { copy.textContent = "Select and copy"; }));
  return h("div", { class: "code-block" },
    h("div", { class: "code-head" }, h("span", { class: "muted" }, language || "text"), copy),
    h("pre", { tabindex: 0 }, h("code", { class: language ? `language-${language}` : undefined }, code)));
}

async function copyText(text) {
  // navigator.clipboard exists only in secure contexts (https, localhost); a node on the LAN is plain http.
  if (navigator.clipboard) return navigator.clipboard.writeText(text);
  const area = h("textarea", { "aria-hidden": "true", class: "offscreen" });
  area.value = text;
  document.body.append(area);
  area.select();
  const copied = document.execCommand("copy");
  area.remove();
  if (!copied) throw new Error("copy refused");
}

// A list and the lists nested in its items; returns the index of the first line after it.
function list(lines, start, out) {
  const first = ITEM.exec(lines[start]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const element = h(ordered ? "ol" : "ul", ordered && parseInt(first[2], 10) !== 1
    ? { start: parseInt(first[2], 10) } : {});
  let index = start;
  let loose = false;
  const items = [];
  while (index < lines.length) {
    const match = ITEM.exec(lines[index]);
    if (!match || match[1].length !== indent || /\d/.test(match[2]) !== ordered) break;
    const body = [match[3] ?? ""];
    const contentIndent = match[1].length + match[2].length + 1;
    index += 1;
    while (index < lines.length) {
      const line = lines[index];
      const nested = ITEM.exec(line);
      if (line.trim() === "") {
        const next = lines[index + 1];
        if (next === undefined || (leading(next) <= indent && next.trim() !== "")) break;
        loose = true;
      } else if (leading(line) <= indent && (nested || startsBlock(line))) {
        break;
      } else if (leading(line) <= indent && body.at(-1) === "") {
        break;
      }
      body.push(line.slice(Math.min(leading(line), contentIndent)));
      index += 1;
    }
    items.push(body);
  }
  for (const body of items) {
    const content = blocks(body);
    // A tight list's items hold their text directly, not in paragraphs.
    const shown = loose ? content : content.flatMap((node) => (node.tagName === "P" ? [...node.childNodes] : [node]));
    element.append(h("li", {}, shown));
  }
  out.push(element);
  return index;
}

function leading(line) {
  return line.length - line.trimStart().length;
}

function table(lines, start, out) {
  const alignments = cells(lines[start + 1]).map((cell) => {
    const left = cell.startsWith(":");
    const right = cell.endsWith(":");
    return left && right ? "center" : right ? "right" : left ? "left" : undefined;
  });
  const header = cells(lines[start]);
  let index = start + 2;
  const rows = [];
  while (index < lines.length && lines[index].includes("|") && lines[index].trim() !== "") {
    rows.push(cells(lines[index++]));
  }
  // Classes, not style attributes: the page's content security policy refuses inline styles.
  const cell = (tag, text, column) => h(tag, { class: alignments[column] && `align-${alignments[column]}` },
    inline(text));
  out.push(h("div", { class: "scroll" }, h("table", { class: "md-table" },
    h("thead", {}, h("tr", {}, header.map((text, column) => cell("th", text, column)))),
    h("tbody", {}, rows.map((row) => h("tr", {}, header.map((_, column) => cell("td", row[column] ?? "", column))))))));
  return index;
}

function cells(line) {
  const trimmed = line.trim().replace(/^\|/, "").replace(/(?<!\\)\|$/, "");
  return trimmed.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

// Inline spans: the earliest match wins; at one position the patterns are tried in this order.
const INLINE = new RegExp([
  /\\(?<escaped>[!-/:-@[-`{-~])/.source,
  /(?<ticks>`+)(?<code>[^`]|[^`][\s\S]*?[^`])\k<ticks>(?!`)/.source,
  /(?<image>!?)\[(?<label>[^\]\n]*)\]\((?<href>[^)\s]+)(?:\s+"[^"]*")?\)/.source,
  /<(?<autolink>(?:https?:\/\/|mailto:)[^>\s]+)>/.source,
  /\*\*(?<strong>\S(?:[\s\S]*?\S)?)\*\*/.source,
  /__(?<strongUnderscore>\S(?:[\s\S]*?\S)?)__(?!\w)/.source,
  /~~(?<strike>\S(?:[\s\S]*?\S)?)~~/.source,
  /\*(?<emphasis>[^\s*](?:[\s\S]*?[^\s*])?)\*/.source,
  /(?<![\w\\])_(?<emphasisUnderscore>[^\s_](?:[\s\S]*?[^\s_])?)_(?!\w)/.source,
].join("|"));

export function inline(text) {
  const out = [];
  let rest = text;
  for (;;) {
    const match = INLINE.exec(rest);
    if (!match) break;
    if (match.index > 0) out.push(rest.slice(0, match.index));
    out.push(span(match.groups));
    rest = rest.slice(match.index + match[0].length);
  }
  if (rest) out.push(rest);
  return out;
}

function span(groups) {
  if (groups.escaped !== undefined) return groups.escaped;
  if (groups.code !== undefined) {
    const code = groups.code;
    return h("code", {}, /^ .* $/.test(code) ? code.slice(1, -1) : code);
  }
  if (groups.label !== undefined) {
    const label = groups.image ? `image: ${groups.label || groups.href}` : groups.label;
    return link(groups.href, groups.image ? [label] : inline(label), `${groups.image}[${groups.label}](${groups.href})`);
  }
  if (groups.autolink !== undefined) return link(groups.autolink, [groups.autolink], `<${groups.autolink}>`);
  if (groups.strong !== undefined) return h("strong", {}, inline(groups.strong));
  if (groups.strongUnderscore !== undefined) return h("strong", {}, inline(groups.strongUnderscore));
  if (groups.strike !== undefined) return h("del", {}, inline(groups.strike));
  return h("em", {}, inline(groups.emphasis ?? groups.emphasisUnderscore));
}

function link(href, content, source) {
  if (!SAFE_LINK.test(href)) return source;
  return h("a", { href, target: "_blank", rel: "noopener noreferrer" }, content);
}
