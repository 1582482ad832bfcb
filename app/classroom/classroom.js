// The classroom's page: the presenter moves the class, every screen follows (server-sent
// events), and the live question is asked, answered and revealed here. Its settings come from
// the page (app/classroom/page.py) as CONFIG; token text is untrusted: DOM built with textContent.
const ROOM = CONFIG.room, KEY = CONFIG.key, COUNT = CONFIG.count;
const SERVER = CONFIG.server, STATIC = CONFIG.static, LANG = CONFIG.lang || 'en';  // the stages' language
const api = path => `${SERVER}/classroom/${ROOM}/${path}`;
let shown = -1, version = -1, target = 0, pending = 0;  // target: where the presenter's keys have sent the class
let moved = false;  // the presenter pressed a key: its target is its own from then on
let room = null;  // the room's newest state (pushed)
const $ = id => document.getElementById(id);
// this screen's words (its browser's language, sent by the classroom's page as CONFIG.text):
// tr(English, {names}) and trn(one, other, n, {names}): the catalog's text, its {names} filled
const TEXT = CONFIG.text || {};
const fill = (s, v) => s.replace(/\{(\w+)\}/g, (m, k) => (v && k in v ? v[k] : m));
const tr = (msg, v) => fill(typeof TEXT[msg] === 'string' && TEXT[msg] ? TEXT[msg] : msg, v);
function trn(one, other, n, v) {  // English: one / other; a language with one form (Chinese): that form
  const forms = Array.isArray(TEXT[one]) && TEXT[one].every(f => f) ? TEXT[one] : [one, other];
  return fill(forms.length === 1 ? forms[0] : forms[n === 1 ? 0 : 1], {n, ...v});
}
function el(tag, attrs, ...kids) {  // DOM built with textContent: token text is untrusted
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) { if (k === 'text') e.textContent = v; else e.setAttribute(k, v); }
  for (const k of kids) e.append(k);
  return e;
}
const visible = t => t.replace(/ /g, '␣').replace(/\n/g, '↵').replace(/\t/g, '⇥')
  .replace(/[\x00-\x1f\x7f]/g, c => '\\x' + c.charCodeAt(0).toString(16).padStart(2, '0'));
// a token that is part of a character has no text: its id once revealed, its button's number before
// (the class gets no token id before the reveal: a low id ranks a candidate)
const label = c => c.text !== '' ? c.text : c.token_id !== undefined ? `#${c.token_id}` : `(no-text-${c.choice + 1})`;
let voter = null;
try { voter = localStorage.getItem('tt-voter') || (crypto.randomUUID ? crypto.randomUUID() :
         String(Math.random()).slice(2) + Date.now()); localStorage.setItem('tt-voter', voter); } catch (e) {}
async function show(i, v) {
  if (i === shown && v === version) return;
  let d = null;
  try {
    // immutable per trace version: the browser's cache serves a revisit (a bundle: its own file)
    const revealed = room && (room.hidden_from === null || room.hidden_from === undefined) ? 'revealed/' : '';
    const r = await fetch(STATIC ? `stages/${revealed}${i}.json` : api(`stage/${i}?v=${v}&lang=${LANG}`));
    if (r.ok) d = await r.json();
  } catch (e) {}
  if (!d) { setTimeout(() => { if (room) enqueue(room); }, 1000); return; }  // offline: try the newest state again
  $('tt-class-stage').innerHTML = d.html;
  syncCode(room);
  $('tt-class-pos').textContent = i + 1;
  document.querySelectorAll('.tt-class-dot').forEach(b => b.classList.toggle('tt-on', +b.dataset.i === i));
  document.body.dataset.stage = i;
  shown = i; version = v;
  if (KEY) presenterButtons();
}
function myVote(q) { try { return localStorage.getItem(`tt-vote-${ROOM}-${q.id}`); } catch (e) { return null; } }
async function vote(q, payload, label) {
  const err = $('tt-q-err');
  try {
    // text/plain: a bundle on another origin votes without a CORS preflight (the server reads JSON either way)
    const r = await fetch(api('vote'), {method: 'POST', headers: {'Content-Type': 'text/plain'},
      body: JSON.stringify({...payload, voter})});
    const d = await r.json();
    if (!r.ok) { err.textContent = d.error ? tr(d.error.message) : tr('the vote was refused'); return; }
    try { localStorage.setItem(`tt-vote-${ROOM}-${q.id}`, label); } catch (e) {}
    err.textContent = '';
    renderQuestion({...q, votes: Math.max(q.votes, d.votes)});
  } catch (e) { err.textContent = tr('no connection: the vote was not sent'); }
}
function bar(cls, share) { return el('span', {class: 'tt-q-bar ' + cls, style: `width:${Math.round(share * 160)}px`}); }
let drawn = '';  // which question (and whether revealed) the box shows: a new count only updates it
function countText(q, mine) {
  return trn('{n} vote so far', '{n} votes so far', q.votes) +
    (mine ? ' · ' + tr('your vote: {vote} (you may change it)', {vote: visible(mine)}) : '');
}
function renderQuestion(q) {
  const box = $('tt-class-q');
  document.body.dataset.question = q ? (q.revealed ? 'revealed' : 'open') : 'none';
  if (!q) { drawn = ''; box.hidden = true; box.replaceChildren(); if (KEY) presenterButtons(); return; }
  box.hidden = false;
  const mine = myVote(q);
  if (!q.revealed && drawn === `${q.id}` && $('tt-q-count')) {  // keep what a student is typing
    $('tt-q-count').textContent = countText(q, mine);
    box.querySelectorAll('.tt-q-choice').forEach(b => b.classList.toggle('tt-mine', b.dataset.text === mine));
    return;
  }
  drawn = q.revealed ? `${q.id}r` : `${q.id}`;
  const kids = [el('h3', {text: q.revealed ? tr('Predict the next token: the answer') : tr('Predict the next token')}),
    el('div', {}, tr('What does the model write next after') + ' ', el('span', {class: 'tt-q-context'}, '…' + q.context,
       // revealed: the blank holds the token the model drew (a "?" left there read as still open)
       el('span', {class: 'tt-q-blank', text: q.revealed ? visible(label(q.drawn)) : '?'})))];
  if (!q.revealed) {
    const choices = el('div', {class: 'tt-q-choices'});
    for (const c of q.candidates) {
      const b = el('button', {class: 'tt-q-choice' + (mine === label(c) ? ' tt-mine' : ''), 'data-choice': c.choice,
                              text: visible(label(c))});
      b.dataset.text = label(c);
      if (KEY) b.disabled = true; else b.onclick = () => vote(q, {choice: c.choice}, label(c));
      choices.append(b);
    }
    kids.push(choices);
    if (!KEY) {
      const input = el('input', {id: 'tt-q-text', maxlength: 40, placeholder: tr('or type your guess')});
      const send = el('button', {id: 'tt-q-send', text: tr('Guess')});
      send.onclick = () => { const g = input.value.trim(); if (g) vote(q, {guess: g}, g); };
      input.onkeydown = e => { if (e.key === 'Enter') send.onclick(); };
      kids.push(el('div', {class: 'tt-q-guess'}, input, ' ', send));
    }
    kids.push(el('div', {class: 'tt-q-note', id: 'tt-q-count', text: countText(q, mine)}));
  } else {
    const rows = q.candidates.map(c => el('tr', {class: c.token_id === q.drawn.token_id ? 'tt-q-drawn' : ''},
      el('td', {text: (c.token_id === q.drawn.token_id ? '▶ ' : '') + visible(label(c))}),
      el('td', {}, bar('tt-q-model', c.final_prob), c.prob_text),  // as every stage prints it (server-side)
      el('td', {}, bar('', c.share), `${c.votes} (${(c.share * 100).toFixed(0)}%)`)));
    kids.push(el('table', {class: 'tt-q-results'}, el('tr', {}, el('th', {text: tr('token')}),
      el('th', {text: q.greedy ? tr("the model's probability (greedy: it takes the most likely token)") :
                      tr("the model's probability (as sampled)")}), el('th', {text: tr("the class's votes")})), ...rows));
    const drawnIn = q.candidates.some(c => c.token_id === q.drawn.token_id);
    const p = q.drawn.prob_text, token = visible(label(q.drawn));
    const how = q.greedy ? tr('greedy: the most likely token, p={p}', {p}) : tr('p={p} where it was drawn', {p});
    kids.push(el('div', {id: 'tt-q-answer', text: (drawnIn ? tr('The model drew {token} ({how})', {token, how}) :
      tr('The model drew {token} ({how}; not among its top candidates)', {token, how})) + ' · ' +
      trn('{correct} of {n} predicted it', '{correct} of {n} predicted it', q.votes, {correct: q.correct}) +
      (mine ? ' · ' + tr('you said {vote}', {vote: visible(mine)}) : '')}));
    if (q.guesses.length) kids.push(el('div', {class: 'tt-q-note', text: tr('typed guesses:') + ' ' +
      q.guesses.map(g => `${visible(g.text)} ×${g.votes}`).join(', ')}));
  }
  kids.push(el('div', {class: 'tt-q-error', id: 'tt-q-err'}));
  if (KEY) {
    const bs = el('div', {class: 'tt-q-presenter'});
    if (!q.revealed) { const r = el('button', {id: 'tt-q-reveal', text: tr('Reveal the answer')});
      r.onclick = () => ask('reveal'); bs.append(r); }
    const c = el('button', {id: 'tt-q-close', text: tr('Close the question')}); c.onclick = () => ask('close');
    bs.append(c); kids.push(bs);
  }
  box.replaceChildren(...kids);
  if (KEY) presenterButtons();
}
function presenterButtons() {  // a question can be asked at any stage, one at a time
  const b = $('tt-q-open');
  if (b) b.parentElement.hidden = !!(room && room.question);
  if ($('tt-q-show')) $('tt-q-show').hidden = !(room && room.hidden_from !== null && room.hidden_from !== undefined);
}
function renderPick(s) {  // every screen says which pass, layer and head its panels show
  const p = s.pick || {}, box = $('tt-class-pick');
  const pass = p.shown === null || p.shown === undefined ? tr('the newest pass') :
    tr('the pass that read {token} (position {position})',
       {token: p.text === null ? tr('token') : '«' + visible(p.text) + '»', position: p.shown});
  // a position is named once a question set it (before one, the class has not been asked about any)
  const hidden = s.hidden_from === null || s.hidden_from === undefined ? '' : ' · ' + (s.asked ?
    tr('the answer from position {position} on is hidden until the reveal', {position: s.hidden_from}) :
    tr('the answer is hidden until the presenter asks the class to predict it (or shows it)'));
  box.textContent = tr('Panels show {pass} · attention layer {layer}, head {head}', {pass, layer: p.layer, head: p.head})
    + hidden;
  document.body.dataset.hidden = hidden ? s.hidden_from : '';
  if (KEY && document.activeElement && document.activeElement.closest('#tt-pick-form') === null) {
    $('tt-pick-pos').value = p.position === null ? '' : p.position;
    $('tt-pick-layer').value = p.layer; $('tt-pick-head').value = p.head;
    if (s.answer_at !== undefined && document.activeElement !== $('tt-q-at'))
      $('tt-q-at').value = Math.max(1, s.ask_at - s.answer_at + 1);
  }
}
function loadCode(d) {  // a view's functions, fetched the first time it opens (300 phones: only when the presenter opens it)
  if (!d.open || d.dataset.loaded) return;
  d.dataset.loaded = 'loading';
  const key = encodeURIComponent(d.dataset.key);
  fetch(STATIC ? `code/${key}.html` : `${SERVER}/code/${key}${LANG === 'en' ? '' : '?lang=' + LANG}`).then(r => r.ok ? r.text() : Promise.reject(r.status))
    .then(html => { d.insertAdjacentHTML('beforeend', html); d.dataset.loaded = 'yes'; })  // the server's, escaped there
    .catch(() => { delete d.dataset.loaded; });
}
function syncCode(s) {  // the stage's code view: open on every screen while the presenter has it open
  const open = !!(s && s.code);
  document.querySelectorAll('#tt-class-stage details.tt-code-box').forEach(d => {
    if (d.open !== open) d.open = open;
    loadCode(d);
  });
}
document.addEventListener('toggle', e => { if (e.target.matches && e.target.matches('details.tt-code-box')) loadCode(e.target); }, true);
async function ask(action) {
  if (!room) {  // a click before the room's first state arrived: read it now (the position needs it)
    const r = await fetch(api('state')); if (r.ok) await apply(await r.json());
  }
  const body = {key: KEY, action};
  if (action === 'open') body.position = room.answer_at + Math.max(1, +$('tt-q-at').value || 1) - 1;
  const r = await fetch(api('question'), {method: 'POST', headers: {'Content-Type': 'application/json'},
    body: JSON.stringify(body)});
  const e = $('tt-q-err') || $('tt-q-ask-err');  // no question box yet: beside the button
  if (!r.ok) { const d = await r.json(); if (e) e.textContent = tr(d.error.message); }  // the API's English: this screen's words else $('tt-q-ask-err').textContent = '';
}
async function apply(s) {
  // a stage was added to the room (an experiment's result): its dots and count come with the page
  if (!CONFIG.static && s.count !== undefined && s.count !== COUNT) { location.reload(); return; }
  room = s;
  // viewers adopt the room's stage; the presenter only at first (a late event must not undo its keys)
  // (a key pressed before the first state came keeps its target: the state must not undo it)
  if (!KEY || (shown < 0 && !moved)) { target = s.stage; await show(s.stage, s.trace_version); }
  else if (!pending && s.stage === target) await show(s.stage, s.trace_version);  // a live trace grew
  if (room === s) { renderPick(s); renderQuestion(s.question); syncCode(s); }
}
let queue = Promise.resolve();  // states applied in order, the newest last
function enqueue(s) { queue = queue.then(() => apply(s)).catch(() => {}); }
let src = null, heard = 0;
function follow() {  // EventSource reconnects by itself after a lost connection; this also covers it giving up
  if (!window.EventSource) { poll(); return; }
  if (src) src.close();
  src = new EventSource(api('events'));
  heard = Date.now();
  src.addEventListener('state', e => { heard = Date.now(); enqueue(JSON.parse(e.data)); });
  src.addEventListener('ping', () => { heard = Date.now(); });
  src.onopen = () => { heard = Date.now(); $('tt-class-link').textContent = tr('live'); document.body.dataset.link = 'live'; };
  src.onerror = () => {
    $('tt-class-link').textContent = tr('reconnecting…'); document.body.dataset.link = 'lost';
    if (src.readyState === EventSource.CLOSED) setTimeout(follow, 1000);
  };
}
window.addEventListener('online', follow);  // back on the network: the room's state now, not at the next retry
setInterval(() => { if (Date.now() - heard > CONFIG.staleMs) follow(); }, 5000);  // a silent, dead stream
async function poll() {  // without EventSource only
  try { const r = await fetch(api('state')); if (r.ok) await apply(await r.json()); } catch (e) {}
  setTimeout(poll, 1000);
}
async function go(i) {
  if (!KEY) return;
  moved = true;
  target = Math.max(0, Math.min(COUNT - 1, i));
  presenterButtons();
  if (pending) return;  // the loop below sends the latest target: one request at a time, in order
  pending = 1;
  try {
    while (true) {
      const want = target;
      const r = await fetch(api('goto'), {method: 'POST',
        headers: {'Content-Type': 'application/json'}, body: JSON.stringify({key: KEY, stage: want})});
      if (!r.ok) break;
      const s = await r.json();
      if (want !== target) continue;
      await show(s.stage, room ? room.trace_version : 0);
      if (want === target) break;  // (else a key pressed while the stage loaded: send the newer one)
    }
  } finally { pending = 0; }
}
if (KEY) {
  document.addEventListener('keydown', e => {
    if (e.target.tagName === 'INPUT') return;
    if (['ArrowRight', 'PageDown', ' ', 'Enter'].includes(e.key)) { e.preventDefault(); go(target + 1); }
    else if (['ArrowLeft', 'PageUp', 'Backspace'].includes(e.key)) { e.preventDefault(); go(target - 1); }
    else if (e.key === 'Home') go(0); else if (e.key === 'End') go(COUNT - 1);
  });
  $('tt-class-next').onclick = () => go(target + 1);
  $('tt-class-prev').onclick = () => go(target - 1);
  $('tt-q-open').onclick = () => ask('open');
  $('tt-q-show').onclick = () => ask('show');
  $('tt-pick-form').onsubmit = async e => {
    e.preventDefault();
    const num = id => $(id).value === '' ? null : Math.max(0, Math.floor(+$(id).value));
    const r = await fetch(api('select'), {method: 'POST', headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({key: KEY, position: num('tt-pick-pos'), layer: num('tt-pick-layer') || 0,
                            head: num('tt-pick-head') || 0})});
    $('tt-pick-err').textContent = r.ok ? '' : ((await r.json()).error || {}).message || tr('refused');
  };
  document.querySelectorAll('.tt-class-dot').forEach(b => b.onclick = () => go(+b.dataset.i));
  $('tt-class-stage').addEventListener('toggle', e => {  // the presenter opens the code: every screen does
    if (!e.target.matches('details.tt-code-box') || (room && !!room.code === e.target.open)) return;
    fetch(api('code'), {method: 'POST', headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({key: KEY, open: e.target.open})});
  }, true);  // (toggle does not bubble)
}
document.querySelectorAll('.tt-class-lang button').forEach(b => b.onclick = () => {  // this screen's language
  document.cookie = `${CONFIG.langCookie}=${b.dataset.lang}; path=/; max-age=31536000; SameSite=Lax`;
  const u = new URL(location.href); u.searchParams.set('lang', b.dataset.lang); location.replace(u);
});
follow();
