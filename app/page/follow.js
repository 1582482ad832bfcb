// The sidebar's answer follows the stream: its text box (150 px) and the box of timed tokens show
// their newest lines as tokens arrive (each update replaces their HTML, which left them at their
// top: on a projector the class saw a long answer's first lines while its newest scrolled out of
// view). A reader who scrolls a box up keeps that place; back at its bottom, it follows again.
(() => {
  const BOXES = {text: "#tt-answer .tt-answer", timed: "#tt-answer .tt-timing"};
  const kept = {};  // which -> the scrollTop the reader left the box at (absent: it follows the newest)
  let shown = "";
  function atBottom(box) { return box.scrollTop + box.clientHeight >= box.scrollHeight - 4; }
  function follow() {
    const text = document.querySelector(BOXES.text);
    const now = text ? text.textContent : "";
    if (now === shown) return;
    if (!now.startsWith(shown.replace(/● streaming$/, "").slice(0, 40))) { delete kept.text; delete kept.timed; }
    shown = now;  // a new request's answer starts at the top: it follows again
    for (const [which, sel] of Object.entries(BOXES)) {
      const box = document.querySelector(sel);
      if (box) box.scrollTop = which in kept ? kept[which] : box.scrollHeight;
    }
  }
  document.addEventListener("scroll", (ev) => {
    for (const [which, sel] of Object.entries(BOXES)) {
      if (ev.target.matches && ev.target.matches(sel)) {
        if (atBottom(ev.target)) delete kept[which]; else kept[which] = ev.target.scrollTop;
      }
    }
  }, true);
  new MutationObserver(follow).observe(document.documentElement, {childList: true, subtree: true, characterData: true});
})();
