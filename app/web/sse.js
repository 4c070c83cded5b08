// A server-sent-events reader over fetch(): EventSource cannot send the Authorization
// header, and a key in the URL would end up in access logs. Parsing follows the HTML
// spec's event-stream rules (fields id/event/data/retry, comments, blank line = dispatch).

import { authHeaders, errorOf } from "./api.js";

export class SseParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buffer = "";
    this.afterCR = false;
    this.reset();
  }

  reset() {
    this.event = "";
    this.data = [];
    this.id = null;
  }

  push(text) {
    // A chunk that ended on the \r of a \r\n: this \n ends no second line.
    if (this.afterCR && text.startsWith("\n")) text = text.slice(1);
    this.afterCR = text.endsWith("\r");
    this.buffer += text;
    const lines = this.buffer.split(/\r\n|\r|\n/);
    this.buffer = lines.pop(); // no line end yet: wait for the next chunk
    for (const line of lines) this.line(line);
  }

  line(line) {
    if (line === "") {
      if (this.data.length) {
        this.onEvent({ event: this.event || "message", data: this.data.join("\n"), id: this.id });
      }
      this.reset();
      return;
    }
    if (line.startsWith(":")) return; // keep-alive comment
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id") this.id = value;
  }
}

// Reads one connection to its end. Resolves when the server closes the stream; rejects
// with an ApiError for a refused request and with the fetch error for a dropped one.
export async function readStream(path, { lastEventId, onEvent, signal }) {
  const headers = authHeaders({ Accept: "text/event-stream" });
  if (lastEventId !== null && lastEventId !== undefined) headers["Last-Event-ID"] = String(lastEventId);
  const response = await fetch(path, { headers, signal, cache: "no-store" });
  if (!response.ok) throw await errorOf(response);
  const parser = new SseParser(onEvent);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    parser.push(value);
  }
  // An event cut off before its blank line is dropped, as the spec says: the reconnect
  // asks again from the last id that was complete.
}
