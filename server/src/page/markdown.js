// The one piece of Markdown the page renders: fenced code blocks, shown preformatted with a
// copy button. Everything else stays as the model wrote it. Every piece of model text is put
// in the page as a text node (textContent), never parsed as HTML.

/** Splits `text` into `{kind: "text" | "code", text, lang}` parts at ``` fences. */
export function parts(text) {
  const out = [];
  const lines = text.split("\n");
  let prose = [];
  let code = null;
  const flush = () => {
    if (prose.length) out.push({ kind: "text", text: prose.join("\n") });
    prose = [];
  };
  for (const line of lines) {
    const fence = line.match(/^\s*```\s*([\w+#.-]*)\s*$/);
    if (code === null && fence) {
      flush();
      code = { kind: "code", text: "", lang: fence[1], lines: [] };
    } else if (code !== null && fence && !fence[1]) {
      code.text = code.lines.join("\n");
      delete code.lines;
      out.push(code);
      code = null;
    } else if (code !== null) {
      code.lines.push(line);
    } else {
      prose.push(line);
    }
  }
  // An open fence (the answer is still streaming) shows as code so far.
  if (code !== null) {
    code.text = code.lines.join("\n");
    delete code.lines;
    out.push(code);
  }
  flush();
  return out;
}

function codeBlock(part) {
  const box = document.createElement("div");
  box.className = "code";
  const pre = document.createElement("pre");
  const code = document.createElement("code");
  code.textContent = part.text;
  pre.append(code);
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "copy";
  copy.textContent = "Copy";
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(part.text);
      copy.textContent = "Copied";
    } catch {
      copy.textContent = "Copy failed";
    }
    setTimeout(() => (copy.textContent = "Copy"), 1500);
  });
  box.append(pre, copy);
  if (part.lang) {
    const lang = document.createElement("span");
    lang.className = "lang";
    lang.textContent = part.lang;
    box.append(lang);
  }
  return box;
}

/** Fills `element` with `text`: prose as text nodes, fenced code as code blocks. */
export function render(element, text) {
  element.replaceChildren(
    ...parts(text).map((p) => (p.kind === "code" ? codeBlock(p) : document.createTextNode(p.text))),
  );
}
