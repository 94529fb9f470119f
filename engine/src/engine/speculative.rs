//! Speculative decoding: a drafter guesses the next few tokens, the target evaluates the pending
//! token and the guesses in one step, and the generation keeps the guesses its own draws confirm.
//!
//! Why the output cannot change: a position's logits are the same bits whether its tokens were
//! evaluated one by one or in one step (batch invariance, docs/architecture.md), and each
//! position's token is drawn by the same sampler, in the same order, with one draw per token,
//! as without a draft ([`super::Generation::verified`]). So greedy output is the target's own,
//! and sampled output is too for a given seed. What a draft changes is how many weight passes
//! the tokens cost: one per step instead of one per token.
//!
//! A step of several tokens runs in the prefill shape, which computes every FFN neuron: sparse
//! decode would give other bits, so speculation needs dense decode ([`Engine::check_can_draft`]).

use super::{reuse_prefix, Engine, Error, Generation};
use conductor_runtime::exec::Session;
use conductor_runtime::sample::argmax;
use std::time::{Duration, Instant};

/// Guesses tokens likely to follow a context. `Send`, so that a server's engine thread can
/// own one.
pub trait Drafter: Send {
    /// Appends to `out` up to `max` tokens likely to follow `context` (every token so far: the
    /// target has evaluated all but the last).
    fn draft(&mut self, context: &[u32], max: usize, out: &mut Vec<u32>) -> Result<(), Error>;

    /// Reads `history` (the prompt, evaluated by the target) before the first draft of a
    /// generation, so that the first draft does not pay for it: a draft model evaluates it in
    /// its own session. Nothing by default.
    fn prime(&mut self, _history: &[u32]) -> Result<(), Error> {
        Ok(())
    }

    /// Whether drafting computes on the cores the target computes on (a draft model): the
    /// target's waiting threads then park before it drafts instead of spinning through it.
    fn shares_cores(&self) -> bool {
        false
    }
}

/// Prompt lookup (llama.cpp's `llama-lookup`): finds the latest earlier occurrence of the
/// context's last few tokens and proposes what followed it. Reads no weights, holds no memory:
/// the draft for a model larger than memory. Pays where text repeats (code, quotes, edits).
#[derive(Clone, Copy, Debug)]
pub struct NgramDrafter {
    /// Longest suffix of the context looked up first; shorter ones down to `min_n` after.
    pub max_n: usize,
    pub min_n: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter { max_n: 4, min_n: 2 }
    }
}

impl Drafter for NgramDrafter {
    fn draft(&mut self, context: &[u32], max: usize, out: &mut Vec<u32>) -> Result<(), Error> {
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if context.len() <= n {
                continue;
            }
            let key = &context[context.len() - n..];
            // Latest match first: recent text predicts best. The match must end before the
            // key itself, so that something follows it.
            let found = (0..context.len() - n)
                .rev()
                .find(|&at| &context[at..at + n] == key);
            if let Some(at) = found {
                let follows = &context[at + n..];
                out.extend_from_slice(&follows[..follows.len().min(max)]);
                return Ok(());
            }
        }
        Ok(())
    }
}

/// A smaller model with the target's vocabulary, decoding greedily in its own session. It
/// stops drafting where its own most likely token falls under `p_min`, as llama.cpp's does.
pub struct ModelDrafter {
    engine: Engine,
    session: Session,
    p_min: f32,
}

/// llama.cpp's default `--draft-p-min`.
pub const DEFAULT_DRAFT_P_MIN: f32 = 0.75;

impl ModelDrafter {
    /// `draft` must share `target`'s vocabulary; its session gets `n_ctx` positions.
    pub fn new(target: &Engine, draft: Engine, n_ctx: usize) -> Result<ModelDrafter, Error> {
        let (ours, theirs) = (target.tokenizer(), draft.tokenizer());
        let differ = |why: String| {
            Err(Error::DraftVocabulary {
                target: ours.n_vocab(),
                draft: theirs.n_vocab(),
                why,
            })
        };
        if ours.n_vocab() != theirs.n_vocab() {
            return differ("the sizes differ".into());
        }
        if let Some(id) =
            (0..ours.n_vocab() as u32).find(|&t| ours.token_text(t) != theirs.token_text(t))
        {
            return differ(format!("token {id} differs"));
        }
        check_dense(target)?;
        let session = draft.session(Some(n_ctx))?;
        Ok(ModelDrafter {
            engine: draft,
            session,
            p_min: DEFAULT_DRAFT_P_MIN,
        })
    }
}

/// The probability softmax gives the largest of `logits`.
fn top_probability(logits: &[f32], top: u32) -> f32 {
    let max = logits[top as usize];
    1.0 / logits.iter().map(|&l| (l - max).exp()).sum::<f32>()
}

impl Drafter for ModelDrafter {
    fn prime(&mut self, history: &[u32]) -> Result<(), Error> {
        let kept = reuse_prefix(&mut self.session, history);
        let room = self.session.n_ctx() - self.session.n_past();
        if kept < history.len() && history.len() - kept <= room {
            self.engine.eval_last(&mut self.session, &history[kept..])?;
        }
        // The target steps next: this engine's threads must not spin through its step.
        self.engine.rest();
        Ok(())
    }

    fn shares_cores(&self) -> bool {
        true
    }

    fn draft(&mut self, context: &[u32], max: usize, out: &mut Vec<u32>) -> Result<(), Error> {
        let result = self.draft_greedily(context, max, out);
        self.engine.rest();
        result
    }
}

impl ModelDrafter {
    /// Up to `max` tokens after `context`, while the draft model is sure of them.
    fn draft_greedily(
        &mut self,
        context: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), Error> {
        let kept = reuse_prefix(&mut self.session, context);
        let room = self.session.n_ctx() - self.session.n_past();
        let max = max.min(room.saturating_sub(context.len() - kept));
        if max == 0 {
            return Ok(());
        }
        let mut logits = self.engine.eval_last(&mut self.session, &context[kept..])?;
        loop {
            let token = argmax(logits);
            if top_probability(logits, token) < self.p_min {
                return Ok(());
            }
            out.push(token);
            if out.len() == max {
                return Ok(());
            }
            logits = self.engine.eval_last(&mut self.session, &[token])?;
        }
    }
}

/// How many tokens to draft: `--draft-max` and `--draft-min`, as in llama.cpp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftLimits {
    /// The most tokens drafted for one step (≥ 1).
    pub max: usize,
    /// Drafts shorter than this are not verified: the step decodes one token.
    pub min: usize,
}

impl Default for DraftLimits {
    fn default() -> Self {
        DraftLimits { max: 8, min: 1 }
    }
}

/// What [`DraftLimits`] cannot be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadDraftLimits(String);

impl DraftLimits {
    pub fn new(max: usize, min: usize) -> Result<DraftLimits, BadDraftLimits> {
        if max == 0 {
            return Err(BadDraftLimits(
                "--draft-max must be at least 1 (the most tokens drafted a step)".into(),
            ));
        }
        if min > max {
            return Err(BadDraftLimits(format!(
                "--draft-min {min} is above --draft-max {max}"
            )));
        }
        Ok(DraftLimits { max, min })
    }
}

/// A drafter and how much to ask of it. The draft length follows what the target keeps: it
/// doubles while every drafted token is kept and falls back to one more than were kept; a
/// drafted step that makes fewer tokens a second than one-token steps halves it (in memory a
/// step of nine tokens can cost several one-token steps: it is compute-bound where one token is
/// bound by memory). Whether to draft at all is judged over a round of [`ROUND_STEPS`] steps
/// that asked the drafter, its drafting, its steps that found nothing and a draft model's
/// catching up included: a round that made fewer tokens a second than one-token steps pauses
/// drafting for a while, twice as long each time it fails again. A round, not a step, because
/// a draft model is unsure at the start of an answer and then sure for long stretches (code
/// repeated with edits), and because it catches up on the text of a pause in its first step
/// after it. The length never changes the output, only how many steps make it.
pub struct Speculation {
    /// `None`: the target drafts for itself from what it keeps resident
    /// ([`Engine::draft_resident`], `--draft self`).
    drafter: Option<Box<dyn Drafter>>,
    limits: DraftLimits,
    /// A step's drafted tokens, and the pending token followed by them.
    drafted: Vec<u32>,
    tokens: Vec<u32>,
    /// Tokens to ask for next step.
    length: usize,
    /// Tokens a second of one-token steps (a moving average).
    plain_rate: Option<f64>,
    /// The round under way: steps that asked the drafter, the tokens they made, their time.
    round: Round,
    /// Steps left without drafting, after a round did not pay.
    pause: u32,
    /// How long the next pause lasts: [`PAUSE_STEPS`], doubled each time a round fails to pay
    /// again, back to [`PAUSE_STEPS`] once one pays.
    next_pause: u32,
    /// Drafted steps since the last one-token step.
    since_plain: u32,
    /// Whether timing paces drafting (the default); unpaced, the length follows what is kept
    /// alone, so that which steps draft does not depend on timing.
    paced: bool,
    /// The context handed to the drafter (the session's tokens and the pending one).
    context: Vec<u32>,
}

/// Steps that asked the drafter, and what they made.
#[derive(Clone, Copy, Debug, Default)]
struct Round {
    steps: u32,
    tokens: usize,
    time: Duration,
}

fn average(old: Option<f64>, new: f64) -> Option<f64> {
    Some(old.map_or(new, |old| 0.75 * old + 0.25 * new))
}

/// The draft length a text starts with: 4, within the limits.
fn initial_length(limits: DraftLimits) -> usize {
    4.clamp(limits.min.max(1), limits.max)
}

/// Steps that ask the drafter before drafting is judged.
const ROUND_STEPS: u32 = 16;
/// One-token steps taken after a round did not pay, before drafting is tried again (the first
/// time; see [`Speculation::next_pause`]).
const PAUSE_STEPS: u32 = 16;
/// The longest pause.
const MAX_PAUSE_STEPS: u32 = 1024;
/// Drafted steps after which a one-token step times the rate to beat again (the first one
/// after a prompt is slower than the rest).
const RETIME_AFTER: u32 = 8;

impl Speculation {
    pub fn new(drafter: Box<dyn Drafter>, limits: DraftLimits) -> Speculation {
        Speculation::with_source(Some(drafter), limits)
    }

    /// `--draft self`: the target drafts for itself with steps that compute only what its
    /// plan keeps resident and read nothing from storage ([`Engine::draft_resident`]), for
    /// a model larger than its memory budget. Needs an engine with a neuron cache
    /// ([`Engine::check_can_draft`]).
    pub fn resident(limits: DraftLimits) -> Speculation {
        Speculation::with_source(None, limits)
    }

    fn with_source(drafter: Option<Box<dyn Drafter>>, limits: DraftLimits) -> Speculation {
        Speculation {
            drafter,
            length: initial_length(limits),
            limits,
            plain_rate: None,
            round: Round::default(),
            pause: 0,
            next_pause: PAUSE_STEPS,
            since_plain: 0,
            paced: true,
            context: Vec::new(),
            drafted: Vec::new(),
            tokens: Vec::new(),
        }
    }

    /// Drafting that does not look at the clock: the length follows what is kept alone. The
    /// output is the same either way; tests that count drafts use this.
    pub fn unpaced(mut self) -> Speculation {
        self.paced = false;
        self
    }

    /// Before the drafter computes: the target rests if they share the cores.
    fn make_room(&self, rest_target: &mut dyn FnMut()) {
        if self.drafter.as_ref().is_some_and(|d| d.shares_cores()) {
            rest_target();
        }
    }

    /// A generation starts after `history` (its prompt, evaluated): the drafter reads it, and
    /// what the last text taught the draft length and its pauses is forgotten (the rates of
    /// steps are the engine's and stay).
    pub(super) fn start(
        &mut self,
        history: &[u32],
        rest_target: &mut dyn FnMut(),
    ) -> Result<(), Error> {
        self.length = initial_length(self.limits);
        self.pause = 0;
        self.next_pause = PAUSE_STEPS;
        self.round = Round::default();
        self.make_room(rest_target);
        match &mut self.drafter {
            Some(drafter) => drafter.prime(history),
            None => Ok(()),
        }
    }

    /// How many tokens to draft for a step with `room` for them: `None` while drafting
    /// pauses, before a one-token step times the rate to beat, or when the room is under the
    /// minimum.
    fn ask(&mut self, room: usize) -> Option<usize> {
        let max = self.length.min(room);
        // A one-token step first, and again now and then: the rate drafted steps must beat.
        let retime = self.paced && (self.plain_rate.is_none() || self.since_plain >= RETIME_AFTER);
        if retime || self.pause > 0 || max == 0 || max < self.limits.min {
            self.pause = self.pause.saturating_sub(1);
            return None;
        }
        Some(max)
    }

    /// The tokens to verify after `pending`, which follows `history` (what the session
    /// holds): at most `room` of them; empty while drafting pauses or when the drafter has
    /// fewer than the minimum. Returns whether the drafter was asked: a step after a draft
    /// that found nothing still paid for the drafting, and is timed as a drafted step.
    /// `rest_target` runs before a drafter that shares the target's cores drafts.
    pub(super) fn propose(
        &mut self,
        history: &[u32],
        pending: u32,
        room: usize,
        out: &mut Vec<u32>,
        rest_target: &mut dyn FnMut(),
    ) -> Result<bool, Error> {
        out.clear();
        let Some(max) = self.ask(room) else {
            return Ok(false);
        };
        self.context.clear();
        self.context.extend_from_slice(history);
        self.context.push(pending);
        self.make_room(rest_target);
        if let Some(drafter) = &mut self.drafter {
            drafter.draft(&self.context, max, out)?;
        }
        self.keep_if_long_enough(out, max);
        Ok(true)
    }

    /// A draft of more than `max` tokens is cut; one under the minimum is not verified.
    fn keep_if_long_enough(&self, out: &mut Vec<u32>, max: usize) {
        out.truncate(max);
        if out.len() < self.limits.min {
            out.clear();
        }
    }

    /// A one-token step without drafting took `took`.
    pub(super) fn stepped(&mut self, took: Duration) {
        self.since_plain = 0;
        self.plain_rate = average(self.plain_rate, 1.0 / took.as_secs_f64().max(1e-9));
    }

    /// `kept` of `drafted` tokens survived a step that took `took`, drafting included (no
    /// tokens drafted: the drafter found none worth verifying, and the step was one token).
    pub(super) fn verified(&mut self, drafted: usize, kept: usize, took: Duration) {
        self.since_plain += 1;
        let plain = self.plain_rate.filter(|_| self.paced);
        let slower = |tokens: usize, time: Duration| {
            plain.is_some_and(|plain| (tokens as f64 / time.as_secs_f64().max(1e-9)) < plain)
        };
        // A step that found nothing says nothing of the length.
        if drafted > 0 {
            self.length = if slower(kept + 1, took) {
                self.length / 2
            } else if kept == drafted {
                self.length * 2
            } else {
                kept + 1
            }
            .max(self.limits.min)
            .clamp(1, self.limits.max);
        }
        self.round.steps += 1;
        self.round.tokens += kept + 1;
        self.round.time += took;
        if self.round.steps < ROUND_STEPS {
            return;
        }
        let round = std::mem::take(&mut self.round);
        if slower(round.tokens, round.time) {
            self.pause = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE_STEPS);
        } else {
            self.next_pause = PAUSE_STEPS;
        }
    }
}

impl Engine {
    /// Evaluates `generation`'s pending token in `session` and hands the generation its
    /// logits: in one step with `speculation`'s drafted tokens after it when the drafter has
    /// some (keeping what the generation's draws confirm), alone otherwise. Check the engine
    /// with [`Engine::check_can_draft`] before stepping with a `speculation`.
    pub fn step_generation(
        &mut self,
        session: &mut Session,
        generation: &mut Generation,
        speculation: Option<&mut Speculation>,
    ) -> Result<(), Error> {
        let Some(pending) = generation.pending() else {
            return Ok(());
        };
        let Some(speculation) = speculation else {
            let t0 = Instant::now();
            let logits = self.driver.get().eval_last(session, &[pending])?;
            return generation.evaluated(logits, t0.elapsed());
        };
        if generation.is_first_step() {
            // The drafter reads the prompt: prompt processing, as the target's was.
            let t0 = Instant::now();
            let driver = self.driver.get();
            speculation.start(session.tokens(), &mut || driver.rest())?;
            generation.charge_prompt(t0.elapsed());
        }
        let t0 = Instant::now();
        // Room for the drafted tokens: in the context, in one step, and in what the
        // generation may still hand out after the pending token's successor.
        let room = (session.n_ctx() - session.n_past())
            .saturating_sub(1)
            .min(self.max_step_tokens().saturating_sub(1))
            .min(self.max_step_logits().saturating_sub(1))
            .min(generation.room().saturating_sub(1));
        let mut drafted = std::mem::take(&mut speculation.drafted);
        let asked = if speculation.drafter.is_some() {
            let driver = self.driver.get();
            speculation.propose(session.tokens(), pending, room, &mut drafted, &mut || {
                driver.rest()
            })?
        } else if let Some(max) = speculation.ask(room) {
            drafted.clear();
            self.draft_resident(session, pending, max, &mut drafted)?;
            speculation.keep_if_long_enough(&mut drafted, max);
            true
        } else {
            drafted.clear();
            false
        };
        let result = if drafted.is_empty() {
            let logits = self.driver.get().eval_last(session, &[pending])?;
            if asked {
                // Drafting cost this step and found nothing: it counts against drafting.
                speculation.verified(0, 0, t0.elapsed());
            } else {
                speculation.stepped(t0.elapsed());
            }
            generation.evaluated(logits, t0.elapsed())
        } else {
            self.verify(session, generation, speculation, pending, &drafted, t0)
        };
        speculation.drafted = drafted;
        result
    }

    /// Up to `max` tokens to follow `pending`, drafted by this engine for itself: one
    /// resident-only step a token ([`conductor_runtime::exec::Driver::step_resident`]: what
    /// the plan keeps resident, nothing read), greedily while the drafted distribution is sure
    /// of its token, as a draft model drafts. The session is as it was after: the verifying
    /// step writes the drafted positions' KV entries anew.
    fn draft_resident(
        &mut self,
        session: &mut Session,
        pending: u32,
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), Error> {
        let n_past = session.n_past();
        let driver = self.driver.get();
        let mut token = pending;
        let mut draft = || -> Result<(), Error> {
            while out.len() < max {
                driver.step_resident(session, token)?;
                let logits = driver.logits();
                token = argmax(logits);
                if top_probability(logits, token) < DEFAULT_DRAFT_P_MIN {
                    break;
                }
                out.push(token);
            }
            Ok(())
        };
        let result = draft();
        session.truncate(n_past);
        result
    }

    /// One step over `pending` and `drafted`; the session keeps what the draws confirm.
    fn verify(
        &mut self,
        session: &mut Session,
        generation: &mut Generation,
        speculation: &mut Speculation,
        pending: u32,
        drafted: &[u32],
        t0: Instant,
    ) -> Result<(), Error> {
        let n_past = session.n_past();
        let tokens = &mut speculation.tokens;
        tokens.clear();
        tokens.push(pending);
        tokens.extend_from_slice(drafted);
        // One step (the room kept the tokens within one), whose logits cover every token.
        let driver = self.driver.get();
        driver.eval(session, tokens, 0, &mut |_, _| {})?;
        let kept = generation.verified(driver.logits(), drafted, t0.elapsed(), &self.tokenizer)?;
        session.truncate(n_past + 1 + kept);
        speculation.verified(drafted.len(), kept, t0.elapsed());
        Ok(())
    }

    /// Whether this engine can verify drafts: dense decode (the FFN a one-token step computes
    /// must be the dense one a multi-token step computes) and room for the drafted tokens'
    /// logits ([`super::EngineBuilder::step_logits`]).
    /// With [`Speculation::resident`] (`--draft self`), a neuron cache too: without one
    /// everything is resident and the drafts would cost what the target's steps cost.
    pub fn check_can_draft(&self, speculation: &Speculation) -> Result<(), Error> {
        check_dense(self)?;
        if self.max_step_logits() < 2 {
            return Err(Error::DraftNoRoom);
        }
        if speculation.drafter.is_none() && self.cache_report().is_none() {
            return Err(Error::DraftSelfInMemory);
        }
        Ok(())
    }
}

/// Speculation needs the FFN that one-token steps compute to be the dense one a multi-token
/// step computes.
fn check_dense(engine: &Engine) -> Result<(), Error> {
    match engine.model().sparse() {
        Some(_) => Err(Error::DraftNeedsDense),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(context: &[u32], max: usize) -> Vec<u32> {
        let mut out = Vec::new();
        NgramDrafter::default()
            .draft(context, max, &mut out)
            .unwrap();
        out
    }

    #[test]
    fn ngram_lookup_proposes_what_followed_the_latest_match() {
        // "7 8" occurred twice; the latest occurrence is followed by 5 6.
        let context = [7, 8, 1, 2, 3, 7, 8, 5, 6, 9, 7, 8];
        assert_eq!(lookup(&context, 8), vec![5, 6, 9, 7, 8]);
        assert_eq!(lookup(&context, 2), vec![5, 6]);
        // The longest suffix wins: "3 7 8" occurred once, followed by 5 6 …
        let context = [3, 7, 8, 5, 6, 1, 7, 8, 4, 3, 7, 8];
        assert_eq!(lookup(&context, 3), vec![5, 6, 1]);
        // Nothing repeats: nothing to propose.
        assert!(lookup(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(lookup(&[], 4).is_empty());
        assert!(lookup(&[1], 4).is_empty());
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_draft_length_follows_what_is_kept_while_drafting_pays() {
        let limits = DraftLimits::new(8, 1).unwrap();
        let mut s = Speculation::new(Box::new(NgramDrafter::default()), limits);
        assert_eq!(s.length, 4);
        // No draft before a one-token step has been timed, though the text repeats.
        let mut out = Vec::new();
        s.propose(&[1, 2, 3, 1, 2], 3, 8, &mut out, &mut || {})
            .unwrap();
        assert!(out.is_empty());
        s.stepped(ms(100));
        s.propose(&[1, 2, 3, 1, 2], 3, 8, &mut out, &mut || {})
            .unwrap();
        assert_eq!(out, [1, 2, 3]);
        // 10 tokens a second without drafts. Bound by reads: 4 drafts kept for 140 ms, 36 tokens
        // a second: longer.
        s.stepped(ms(100));
        s.verified(4, 4, ms(140));
        assert_eq!(s.length, 8);
        s.verified(8, 8, ms(200));
        assert_eq!(s.length, 8);
        s.verified(8, 2, ms(150));
        assert_eq!(s.length, 3);
        // A step that found nothing leaves the length alone.
        s.verified(0, 0, ms(140));
        assert_eq!(s.length, 3);
        // Bound by compute: a step that makes fewer tokens a second than one-token steps
        // halves the draft, though every drafted token was kept.
        let mut t = Speculation::new(Box::new(NgramDrafter::default()), limits);
        t.stepped(ms(100));
        t.verified(4, 4, ms(1000)); // 5 tokens a second
        assert_eq!((t.length, t.pause), (2, 0));
        t.verified(2, 2, ms(400));
        assert_eq!((t.length, t.pause), (1, 0));
        t.verified(1, 1, ms(300));
        assert_eq!((t.length, t.pause), (1, 0));
        // Unpaced, neither the first step nor slow steps stop drafting.
        let mut v = Speculation::new(Box::new(NgramDrafter::default()), limits).unpaced();
        v.propose(&[1, 2, 3, 1, 2], 3, 8, &mut out, &mut || {})
            .unwrap();
        assert_eq!(out, [1, 2, 3]);
        v.stepped(ms(100));
        v.verified(4, 4, ms(1000));
        assert_eq!((v.length, v.pause), (8, 0));
        // The minimum holds.
        let strict = DraftLimits::new(8, 6).unwrap();
        let mut u = Speculation::new(Box::new(NgramDrafter::default()), strict).unpaced();
        assert_eq!(u.length, 6);
        u.propose(&[1, 2, 3, 4, 5, 6, 7, 8, 1], 2, 8, &mut out, &mut || {})
            .unwrap();
        assert_eq!(out, [3, 4, 5, 6, 7, 8]);
        u.verified(8, 2, ms(100));
        assert_eq!(u.length, 6);
    }

    /// Runs `steps` steps that asked the drafter, each keeping `kept` of `drafted` in `took`.
    fn round(s: &mut Speculation, steps: u32, drafted: usize, kept: usize, took: Duration) {
        for _ in 0..steps {
            s.verified(drafted, kept, took);
        }
    }

    #[test]
    fn drafting_pauses_after_a_round_that_did_not_pay_and_not_before() {
        let limits = DraftLimits::new(8, 1).unwrap();
        let mut s = Speculation::new(Box::new(NgramDrafter::default()), limits);
        // 10 tokens a second without drafts.
        s.stepped(ms(100));
        // An answer's start: the drafter finds nothing for a while, and each try costs a
        // little. No pause before the round is over...
        round(&mut s, 6, 0, 0, ms(140));
        assert_eq!(s.pause, 0);
        // ... where drafts make up for it: 6 x 1 + 10 x 5 tokens in 6 x 140 + 10 x 300 ms,
        // 14.6 tokens a second.
        round(&mut s, ROUND_STEPS - 6, 4, 4, ms(300));
        assert_eq!((s.pause, s.next_pause), (0, PAUSE_STEPS));
        // Prose: the drafter rarely finds anything and its tries cost time. The round ends in
        // a pause; once it is over, the drafter is asked again, and another round that does
        // not pay pauses twice as long.
        round(&mut s, ROUND_STEPS, 0, 0, ms(130));
        assert_eq!((s.pause, s.next_pause), (PAUSE_STEPS, 2 * PAUSE_STEPS));
        let mut out = Vec::new();
        for _ in 0..PAUSE_STEPS {
            assert!(!s
                .propose(&[1, 2, 3, 1, 2], 3, 8, &mut out, &mut || {})
                .unwrap());
            assert!(out.is_empty());
        }
        s.stepped(ms(100));
        assert!(s
            .propose(&[1, 2, 3, 1, 2], 3, 8, &mut out, &mut || {})
            .unwrap());
        round(&mut s, ROUND_STEPS - 1, 0, 0, ms(130));
        assert_eq!((s.pause, s.next_pause), (0, 2 * PAUSE_STEPS));
        round(&mut s, 1, 0, 0, ms(130));
        assert_eq!((s.pause, s.next_pause), (2 * PAUSE_STEPS, 4 * PAUSE_STEPS));
        // A round that pays sets the next pause back.
        s.pause = 0;
        round(&mut s, ROUND_STEPS, 2, 2, ms(150));
        assert_eq!((s.pause, s.next_pause), (0, PAUSE_STEPS));
        // A drafter that costs nothing and finds nothing pays (its steps are one-token steps).
        round(&mut s, ROUND_STEPS, 0, 0, ms(95));
        assert_eq!(s.pause, 0);
        // A new text forgets the pause and the length, not the rate to beat.
        round(&mut s, ROUND_STEPS, 0, 0, ms(400));
        s.verified(1, 0, ms(400));
        assert!(s.pause > 0);
        s.start(&[1, 2, 3], &mut || {}).unwrap();
        assert_eq!((s.pause, s.next_pause, s.length), (0, PAUSE_STEPS, 4));
        assert!(s.plain_rate.is_some());
    }

    #[test]
    fn nonsense_limits_are_refused() {
        assert!(DraftLimits::new(0, 0)
            .unwrap_err()
            .0
            .contains("--draft-max"));
        assert!(DraftLimits::new(2, 3)
            .unwrap_err()
            .0
            .contains("--draft-min 3"));
        assert!(DraftLimits::new(3, 0).is_ok());
    }
}
