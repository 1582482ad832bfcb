// A stage's code view holds only its closed line; its functions come from GET /code/{key}
// (app/page/code_panel.py) the first time it opens, so a page load does not carry them.
// The HTML is the server's own (every text escaped there); the browser keeps it.
document.addEventListener('toggle', e => {
  const box = e.target;
  if (!box.open || !box.matches || !box.matches('details.tt-code-box[data-src]') || box.dataset.loaded) return;
  box.dataset.loaded = 'loading';
  fetch(box.dataset.src).then(r => r.ok ? r.text() : Promise.reject(r.status)).then(html => {
    box.insertAdjacentHTML('beforeend', html);
    box.dataset.loaded = 'yes';
  }).catch(() => { delete box.dataset.loaded; });  // a later opening tries again
}, true);  // (toggle does not bubble)
