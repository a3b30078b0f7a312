// A tiny element builder: h("td", {class: "num"}, "12"). Attributes starting with "on" become listeners.
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name === "class") element.className = value;
    else if (name in element && typeof value !== "string") element[name] = value;
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
}

// Replaces an element's children (the element, and focus outside it, stay).
export function fill(element, ...children) {
  element.replaceChildren();
  append(element, children);
  return element;
}

// A table with a caption-less header row; `rows` are arrays of cells (strings or nodes).
export function table(label, headers, rows, empty = "none") {
  if (rows.length === 0) return h("p", { class: "muted" }, empty);
  return h("div", { class: "scroll" },
    h("table", { "aria-label": label },
      h("thead", {}, h("tr", {}, headers.map((header) => h("th", { scope: "col" }, header)))),
      h("tbody", {}, rows.map((row) => h("tr", {}, row.map((cell) => h("td", {}, cell)))))));
}

export function badge(text, kind = text) {
  return h("span", { class: `badge badge-${kind}` }, text);
}

export function section(id, title, ...children) {
  return h("section", { id: `view-${id}`, class: "view", "aria-labelledby": `${id}-title`, hidden: true },
    h("h2", { id: `${id}-title` }, title), children);
}
