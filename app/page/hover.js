// Hover on the page's matrices (attention, embedding rows, KV pool, the attention overview): an
// <img data-tt-hover> carries its cells' values and labels (visualizers/_html.hover_attr); the
// pointer's cell is named in one floating tip. Clicking a token (any panel's data-pos: a chip, a
// map label, a table row) selects the pass that read it: "POS:NONCE" into the hidden #tt-pick box.
// Clicking an overview cell opens that layer and head: "LAYER:HEAD:NONCE" into #tt-pick-head.
// Clicking a sampling candidate's token puts it in the logit-bias control: "ID:NONCE" into #tt-pick-bias.
(() => {
  const CODES = {65535: "not captured", 65534: "masked (causal: a later key)", 65533: "masked (outside the sliding window)"};
  function spec(el) {
    if (el._ttSrc !== el.dataset.ttHover) {  // Gradio swaps the panel's HTML: parse once per drawing
      const s = JSON.parse(el.dataset.ttHover);
      if (s.v) {
        const b = atob(s.v), buf = new Uint8Array(b.length);
        for (let i = 0; i < b.length; i++) buf[i] = b.charCodeAt(i);
        s.vals = s.enc === "i32" ? new Int32Array(buf.buffer) : new Uint16Array(buf.buffer);
      }
      el._tt = s; el._ttSrc = el.dataset.ttHover;
    }
    return el._tt;
  }
  // the words a hover writes: the panel's spec carries them in the page's language (s.words,
  // s.code_words: from the catalogs), these English ones where an older spec has none
  const WORDS = {head: "layer {layer}{local} · query head {head} (KV head {kv}) · query {q} {name}",
    local: " (local, window {w})", none: "{head} · not captured", most: "{head} attends most to {keys} · {ctx}"};
  function fill(t, v) { return t.replace(/\{(\w+)\}/g, (m, k) => (k in v ? String(v[k]) : m)); }
  function fmtValue(s, x) {
    const codes = s.code_words || CODES;
    if (s.enc === "u16" && codes[x]) return codes[x];
    return (x / s.scale).toFixed(4);
  }
  function cellWords(s, row, col) {  // the attention overview: one layer and head, its top keys
    const W = s.words || WORDS, w = s.local[row], t = s.top[row] ? s.top[row][col] : null;
    const head = fill(W.head, {layer: s.layers[row], local: w ? fill(W.local, {w}) : "", head: s.heads[col],
                               kv: s.kv, q: s.q, name: s.qname});
    if (!t) return fill(W.none, {head});
    const keys = [];
    for (let i = 0; i < t.length; i += 2) keys.push(`${s.names[t[i]]}@${t[i]} ${t[i + 1].toFixed(2)}`);
    return fill(W.most, {head, keys: keys.join(", "), ctx: s.ctx});
  }
  function describe(s, row, col) {
    if (s.kind === "cells") return cellWords(s, row, col);
    if (s.kind === "blocks") {
      const b = row * s.w + col;
      if (b >= s.n) return "";
      return (s.blocks && s.blocks[b]) || (s.free ? s.free.replace("{block}", b) : `block ${b} · free`);
    }
    const c = col - (s.x0 || 0);
    const r = s.rows ? s.rows[row] : row;
    if (c < 0) return `${s.row_name || "row"} ${r}` + (s.gutter ? ` · ${s.gutter[row] || ""}` : "") + (s.ctx ? ` · ${s.ctx}` : "");
    const cl = (s.same ? s.rows : s.cols || [])[c];  // same: columns are the rows' positions (attention)
    const v = s.vals ? fmtValue(s, s.vals[row * (s.w - (s.x0 || 0)) + c]) : "";
    return s.fmt.replace("{r}", r).replace("{c}", cl === undefined ? c : cl).replace("{v}", v) + (s.ctx ? ` · ${s.ctx}` : "");
  }
  let tip = null;
  document.addEventListener("mousemove", (ev) => {
    const el = ev.target.closest ? ev.target.closest("[data-tt-hover]") : null;
    if (!tip) { tip = document.createElement("div"); tip.id = "tt-hover-tip"; document.body.appendChild(tip); }
    if (!el) { tip.style.display = "none"; return; }
    const s = spec(el), box = el.getBoundingClientRect();
    const col = Math.min(s.w - 1, Math.floor((ev.clientX - box.left) / box.width * s.w));
    const row = Math.min(s.h - 1, Math.floor((ev.clientY - box.top) / box.height * s.h));
    const text = describe(s, row, col);
    if (!text) { tip.style.display = "none"; return; }
    tip.textContent = text;
    tip.dataset.row = row; tip.dataset.col = col;
    tip.style.display = "block";
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 4) + "px";
    tip.style.top = (ev.clientY + 16) + "px";
  }, {passive: true});
  function cellAt(el, ev) {  // the (row, col) of a hover map under a pointer event
    const s = spec(el), box = el.getBoundingClientRect();
    return [Math.min(s.h - 1, Math.floor((ev.clientY - box.top) / box.height * s.h)),
            Math.min(s.w - 1, Math.floor((ev.clientX - box.left) / box.width * s.w)), s];
  }
  function send(id, value) {  // a new value every click: Gradio fires "change"
    const box = document.querySelector(`#${id} textarea, #${id} input`);
    if (!box) return false;
    box.value = value;
    box.dispatchEvent(new Event("input", {bubbles: true}));
    return true;
  }
  document.addEventListener("click", (ev) => {
    if (!ev.target.closest) return;
    const cells = ev.target.closest("img.tt-ov-img[data-tt-hover]");
    if (cells) {
      const [row, col, s] = cellAt(cells, ev);
      send("tt-pick-head", `${s.layers[row]}:${s.heads[col]}:${Date.now()}`);
      return;
    }
    const biased = ev.target.closest("#tt-sampling [data-bias-id]");  // a candidate: bias it next request
    if (biased) { send("tt-pick-bias", `${biased.dataset.biasId}:${Date.now()}`); return; }
    const chip = ev.target.closest(".tt-panel [data-pos]");
    if (!chip || !send("tt-pick", `${chip.dataset.pos}:${Date.now()}`)) return;
    document.querySelectorAll("#tt-tokens .tt-picked").forEach((c) => c.classList.remove("tt-picked"));
    document.querySelectorAll(`#tt-tokens [data-pos="${chip.dataset.pos}"]`).forEach((c) => c.classList.add("tt-picked"));
  });
})();
