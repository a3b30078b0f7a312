// How numbers read on the page.
const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function bytes(count) {
  if (count === null || count === undefined) return "–";
  let value = count;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${UNITS[unit]}`;
}

export function number(value, digits = 1) {
  if (value === null || value === undefined) return "–";
  return Number.isInteger(value) ? String(value) : value.toFixed(digits);
}

export function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 120) return `${value.toFixed(1)} s`;
  return `${Math.round(value / 60)} min`;
}

export function ago(epochSeconds) {
  return `${seconds(Math.max(0, Date.now() / 1000 - epochSeconds))} ago`;
}

export function shortId(id) {
  return id ? String(id).slice(0, 8) : "–";
}

export function layers(start, end) {
  return end === null || end === undefined ? `${start}–end` : `${start}–${end - 1}`;
}
