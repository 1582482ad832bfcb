// Token text whose characters no installed font can draw (Gemma 3's 262,144-entry vocabulary has
// CJK, Hangul and rare symbols) showed as empty boxes in the logit lens (G 1400 finished: "□□").
// Such a character is written as its code point ("U+5DE5"); the cell's title keeps the text. A
// character has no glyph when, drawn on a canvas in the cell's font, it is pixel for pixel the
// box of a private-use code point that no font draws (U+F0001).
(() => {
  const SIZE = 24, CELLS = ".tt-lens-cell code";
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = SIZE;
  const ctx = canvas.getContext("2d", {willReadFrequently: true});
  const known = new Map();  // font + character -> drawn by some font?
  function drawn(text, font) {
    ctx.clearRect(0, 0, SIZE, SIZE);
    ctx.font = font;
    ctx.textBaseline = "top";
    ctx.fillText(text, 2, 2);
    return ctx.getImageData(0, 0, SIZE, SIZE).data.join(",");
  }
  function hasGlyph(ch, font) {
    const key = font + "\u0000" + ch;
    if (!known.has(key)) known.set(key, drawn(ch, font) !== drawn("\u{F0001}", font));
    return known.get(key);
  }
  function fix(el) {
    if (el.dataset.ttGlyphs) return;
    el.dataset.ttGlyphs = "1";
    const font = getComputedStyle(el).font, text = el.textContent;
    let out = "", changed = false, last = false;
    for (const ch of text) {  // by code point (a surrogate pair is one character)
      const cp = ch.codePointAt(0);
      const none = cp > 0x7f && !/\s/.test(ch) && !hasGlyph(ch, font);
      if (none) {  // two in a row: a thin space between them ("U+3076 U+308A", not "U+3076U+308A")
        out += (last ? "\u2009" : "") + "U+" + cp.toString(16).toUpperCase().padStart(4, "0");
        changed = true;
      } else out += ch;
      last = none;
    }
    if (!changed) return;
    el.textContent = out;
    el.classList.add("tt-no-glyph");
    const cell = el.closest("td");
    // the words in the page's language (window.TT_WORDS: the catalogs', by <html lang>)
    const words = (window.TT_WORDS || {})[(document.documentElement.lang || "").startsWith("zh") ? "zh-CN" : "en"] || {};
    const note = (words.noGlyph || "no font here draws {text}: written as its code points").replace("{text}", JSON.stringify(text));
    if (cell) cell.title = (cell.title ? cell.title + " · " : "") + note;
  }
  let queued = false;
  new MutationObserver(() => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; document.querySelectorAll(CELLS).forEach(fix); });
  }).observe(document.documentElement, {subtree: true, childList: true});
})();
