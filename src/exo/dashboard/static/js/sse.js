// Server-sent events read as the HTML standard says: lines end in \n, \r\n or \r; a line starting with ":" is a
// comment (the node's keep-alives: ": queued", ": prefill 2048/18752 tokens (0 cached)"); "field: value" lines
// build an event (several data lines join with \n); a blank line ends it, and only an event with data is
// dispatched. Comments go to `onComment`, never to the caller's JSON.parse.
export async function* serverSentEvents(response, { onComment = () => {} } = {}) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const parser = new EventParser(onComment);
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      yield* parser.feed(value);
    }
    yield* parser.feed("", true);
  } finally {
    // A caller that stops reading early (an error event, [DONE]) lets go of the body: the connection closes and
    // the node cancels the request, rather than it running on unread.
    reader.cancel().catch(() => {});
  }
}

export class EventParser {
  constructor(onComment) {
    this.onComment = onComment;
    this.pending = "";
    this.afterCarriageReturn = false;
    this.startEvent();
  }

  startEvent() {
    this.data = [];
    this.event = "message";
    this.raw = [];
  }

  // The events completed by `text`; `end` flushes a last line with no line break (an event still needs its blank
  // line, as in a browser's EventSource).
  *feed(text, end = false) {
    // A "\r" that ended the last text may be the first half of a "\r\n" split between two reads.
    const rest = this.afterCarriageReturn && text.startsWith("\n") ? text.slice(1) : text;
    if (text) this.afterCarriageReturn = text.endsWith("\r");
    this.pending += rest;
    const lines = this.pending.split(/\r\n|\r|\n/);
    this.pending = lines.pop();
    if (end && this.pending) lines.push(this.pending);
    for (const line of lines) {
      const event = this.line(line);
      if (event) yield event;
    }
  }

  line(line) {
    if (line === "") {
      const complete = this.data.length ? { event: this.event, data: this.data.join("\n"), raw: this.raw.join("\n") }
        : null;
      this.startEvent();
      return complete;
    }
    if (line.startsWith(":")) {
      this.onComment(line.slice(1).replace(/^ /, ""));
      return null;
    }
    this.raw.push(line);
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (name === "data") this.data.push(value);
    else if (name === "event") this.event = value;
    return null;
  }
}
