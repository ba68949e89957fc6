// @ts-check
// JSON values as YAML, for showing a task's spec the way it is written: block mappings and sequences, strings
// plain when YAML reads them back as the same string, quoted when not (single quotes, or double quotes with
// escapes for what single quotes cannot hold), multi-line strings as literal blocks. Reading the output with
// any YAML 1.2 (or 1.1) parser gives the value back; the task page's browser test checks that against the
// server's own parser.

// Words YAML 1.1 or 1.2 reads as a boolean or null rather than a string.
// Some parsers also take bare infinities and NaN as numbers.
const WORDS = /^(?:true|false|yes|no|on|off|y|n|null|~|[-+]?(?:inf|infinity|nan))$/i;
// Numbers in either version: decimal, with `_`, hex, octal, binary, sexagesimal (caught by ":"), infinities and
// NaN; anything starting with a digit, or a sign or dot and a digit, is quoted, which covers dates too.
const NUMBERISH = /^(?:[-+]?\.?[0-9]|[-+]?\.(?:inf|nan)$|\.(?:inf|nan)$)/i;
// A plain scalar cannot start with an indicator character.
const INDICATOR = /^[-?:,[\]{}#&*!|>'"%@`=<]/;
// Code points YAML does not allow unescaped: C0 controls other than tab and newline, DEL, C1 controls other
// than NEL, surrogates, the BOM and the two non-characters; and the line and paragraph separators, which YAML
// 1.1 reads as line breaks.
const UNPRINTABLE = /[\u0000-\u0008\u000b-\u001f\u007f-\u0084\u0086-\u009f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]/u;

function plainOk(s) {
  return (
    s !== "" &&
    s === s.trim() &&
    !WORDS.test(s) &&
    !NUMBERISH.test(s) &&
    !INDICATOR.test(s) &&
    !/[:#\t\n\r\u0085]/.test(s) &&
    !UNPRINTABLE.test(s) &&
    s !== "<<" &&
    !s.startsWith("...")
  );
}

const ESCAPES = { "\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0", "\u0085": "\\N", "\u2028": "\\L", "\u2029": "\\P" };

/// A string in double quotes, with every character YAML could misread escaped.
export function doubleQuoted(s) {
  let out = '"';
  for (const ch of s) {
    if (ESCAPES[ch]) out += ESCAPES[ch];
    else if (UNPRINTABLE.test(ch) || ch === "\u0085") {
      const c = ch.codePointAt(0);
      out += c <= 0xff ? `\\x${c.toString(16).padStart(2, "0")}` : `\\u${c.toString(16).padStart(4, "0")}`;
    } else out += ch;
  }
  return `${out}"`;
}

function quoted(s) {
  // Single quotes when they can hold it (only `'` is doubled); otherwise double quotes with escapes.
  if (!/[\n\r\t\u0085]/.test(s) && !UNPRINTABLE.test(s)) return `'${s.replaceAll("'", "''")}'`;
  return doubleQuoted(s);
}

// Whether a multi-line string can be a literal block (`|`) and read back the same: printable, not starting with
// a space or a line break (a block's indentation is taken from its first line), no line of only spaces or tabs
// (a block would fold it away or take it as indentation), no carriage returns.
function blockOk(s) {
  return s.includes("\n") && !/^[\s]/.test(s) && !/[\r\u0085]/.test(s) && !UNPRINTABLE.test(s) && !/^[ \t]+$/m.test(s) && /\S/.test(s);
}

/// A key or string scalar, on one line.
export function scalarString(s) {
  return plainOk(s) ? s : quoted(s);
}

// A scalar after `key: ` or `- `: one line, or a literal block's header and its lines at `indent`.
function scalar(v, indent) {
  if (v === null || v === undefined) return "null";
  if (typeof v === "boolean") return String(v);
  if (typeof v === "number") {
    if (!Number.isFinite(v)) return v > 0 ? ".inf" : v < 0 ? "-.inf" : ".nan";
    // YAML 1.1 reads an exponent as a number only after a decimal point: "1.0e+21", not "1e+21".
    const n = String(v);
    return /e/.test(n) && !n.includes(".") ? n.replace("e", ".0e") : n;
  }
  const s = String(v);
  if (!blockOk(s)) return scalarString(s);
  // Chomping: `|-` strips the final line break, `|` keeps one, `|+` keeps them all.
  const body = s.replace(/\n+$/, "");
  const trailing = s.length - body.length;
  const header = trailing === 0 ? "|-" : trailing === 1 ? "|" : "|+";
  const pad = " ".repeat(indent);
  const lines = body.split("\n").map((l) => (l ? pad + l : ""));
  for (let i = 1; i < trailing; i++) lines.push("");
  return `${header}\n${lines.join("\n")}`;
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const empty = (v) => (Array.isArray(v) ? v.length === 0 : isObject(v) && Object.keys(v).length === 0);

// The lines of a collection at `indent`.
function block(v, indent, out) {
  const pad = " ".repeat(indent);
  if (Array.isArray(v)) {
    for (const item of v) {
      if (isObject(item) || Array.isArray(item)) {
        if (empty(item)) { out.push(`${pad}- ${Array.isArray(item) ? "[]" : "{}"}`); continue; }
        // The item's first line goes after the dash ("- name: x"), the rest line up under it.
        const start = out.length;
        block(item, indent + 2, out);
        out[start] = `${pad}- ${out[start].slice(indent + 2)}`;
      } else out.push(`${pad}- ${scalar(item, indent + 2)}`);
    }
    return;
  }
  for (const [k, val] of Object.entries(v)) {
    const key = scalarString(k);
    if (empty(val)) out.push(`${pad}${key}: ${Array.isArray(val) ? "[]" : "{}"}`);
    else if (isObject(val) || Array.isArray(val)) {
      out.push(`${pad}${key}:`);
      block(val, indent + 2, out);
    } else out.push(`${pad}${key}: ${scalar(val, indent + 2)}`);
  }
}

/// A JSON value as a YAML document (ending with a line break).
export function toYaml(value) {
  if (!(isObject(value) || Array.isArray(value)) || empty(value)) {
    const one = empty(value) ? (Array.isArray(value) ? "[]" : "{}") : scalar(value, 2);
    return `${one}\n`;
  }
  const out = [];
  block(value, 0, out);
  return `${out.join("\n")}\n`;
}
