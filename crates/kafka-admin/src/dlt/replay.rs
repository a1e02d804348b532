//! Replaying dead letters: one, or every one not yet replayed, to where each came from,
//! refusing those that ask to go elsewhere, and recording progress as records are acknowledged.

use std::collections::BTreeSet;
use std::fmt;

use rdkafka::message::{Message, OwnedMessage};

use kafka::producer::{OutgoingRecord, Producer};

use super::{
    check_destination, original_topic, replay_destination, replay_record, DeadLetterTopic, DltError,
    Progress, Refusal, REFUSED_METRIC,
};

/// What to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    One { partition: i32, offset: i64 },
    All,
}

/// A dead letter a replay refused (left in place, not marked replayed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedLetter {
    pub partition: i32,
    pub offset: i64,
    pub refusal: Refusal,
}

impl fmt::Display for RefusedLetter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "partition {} offset {} refused: {}", self.partition, self.offset, self.refusal)
    }
}

/// The outcome of a replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Records re-published (or, in a dry run, that would be).
    pub replayed: u64,
    /// Records skipped because they were replayed before.
    pub skipped: u64,
    /// Records refused for where they would go (or, in a dry run, that would be), in the
    /// order read; left in place.
    pub refused: Vec<RefusedLetter>,
}

impl fmt::Display for ReplaySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} replayed, {} already replayed before, {} refused",
            self.replayed,
            self.skipped,
            self.refused.len()
        )
    }
}

impl DeadLetterTopic {
    /// Replays `selection` to each record's original topic (or `to`), recording progress.
    /// `dry_run` sends and records nothing. `progress` is told (done, total) as records go.
    ///
    /// Only to this topic's source or its retry topics ([`check_destination`]): a `to`
    /// elsewhere is refused before anything is read ([`DltError::DestinationRefused`]); one
    /// record whose header names another topic is refused ([`DltError::Refused`]); with
    /// [`Selection::All`] such records are refused one by one, listed in the summary, and the
    /// others replayed. Every refusal is logged and counted ([`REFUSED_METRIC`]).
    pub fn replay(
        &self,
        producer: &Producer,
        runtime: &tokio::runtime::Handle,
        selection: Selection,
        to: Option<&str>,
        dry_run: bool,
        mut on_progress: impl FnMut(u64, u64),
    ) -> Result<ReplaySummary, DltError> {
        if let Some(to) = to {
            if let Err(refusal) = check_destination(&self.topic, to) {
                tracing::warn!(topic = %self.topic, destination = to, reason = %refusal, "dead-letter replay refused: --to names a topic the letters did not come from; nothing sent");
                if !dry_run {
                    metrics::counter!(REFUSED_METRIC, "topic" => self.topic.clone()).increment(1);
                }
                return Err(DltError::DestinationRefused { topic: self.topic.clone(), refusal });
            }
        }
        match selection {
            Selection::One { partition, offset } => {
                self.replay_one(producer, runtime, partition, offset, to, dry_run)?;
                on_progress(1, 1);
                Ok(ReplaySummary { replayed: 1, ..ReplaySummary::default() })
            }
            Selection::All => self.replay_all(producer, runtime, to, dry_run, on_progress),
        }
    }

    fn destination(&self, record: &OwnedMessage, to: Option<&str>) -> Result<String, Refusal> {
        replay_destination(&self.topic, record, to)
    }

    /// Logs and counts the refusal of `record` (what it asked for, and why not).
    fn refuse(&self, record: &OwnedMessage, refusal: &Refusal, dry_run: bool) -> RefusedLetter {
        tracing::warn!(
            topic = %self.topic,
            partition = record.partition(),
            offset = record.offset(),
            destination = original_topic(record).as_deref().unwrap_or("-"),
            reason = %refusal,
            dry_run,
            "dead letter refused: left in place, not replayed"
        );
        if !dry_run {
            metrics::counter!(REFUSED_METRIC, "topic" => self.topic.clone()).increment(1);
        }
        RefusedLetter { partition: record.partition(), offset: record.offset(), refusal: refusal.clone() }
    }

    fn replay_one(
        &self,
        producer: &Producer,
        runtime: &tokio::runtime::Handle,
        partition: i32,
        offset: i64,
        to: Option<&str>,
        dry_run: bool,
    ) -> Result<(), DltError> {
        let mut progress = self
            .progress()?
            .into_iter()
            .find(|(candidate, _)| *candidate == partition)
            .map(|(_, progress)| progress)
            .ok_or_else(|| DltError::UnknownPartition { topic: self.topic.clone(), partition })?;
        if progress.is_replayed(offset) {
            return Err(DltError::AlreadyReplayed { topic: self.topic.clone(), partition, offset });
        }
        let (low, high) = self.watermarks(partition)?;
        let missing = || DltError::NoRecord { topic: self.topic.clone(), partition, offset, low, high };
        if offset < low || offset >= high {
            return Err(missing());
        }
        let mut found = None;
        self.read(&[(partition, offset)], |record| {
            if record.offset() == offset {
                found = Some(record);
            }
            Ok(false) // the first record at or after `offset` decides
        })?;
        let record = found.ok_or_else(missing)?;
        let destination = self.destination(&record, to).map_err(|refusal| {
            let refused = self.refuse(&record, &refusal, dry_run);
            DltError::Refused { topic: self.topic.clone(), partition, offset, refusal: refused.refusal }
        })?;
        if dry_run {
            return Ok(());
        }
        runtime.block_on(producer.send(&replay_record(&self.topic, &record, &destination)))?;
        progress.mark(offset);
        self.commit(partition, &progress)
    }

    fn replay_all(
        &self,
        producer: &Producer,
        runtime: &tokio::runtime::Handle,
        to: Option<&str>,
        dry_run: bool,
        mut on_progress: impl FnMut(u64, u64),
    ) -> Result<ReplaySummary, DltError> {
        let mut summary = ReplaySummary::default();
        let mut states = self.progress()?;
        let mut total = 0u64;
        let mut from = Vec::new();
        for (partition, state) in &states {
            let (low, high) = self.watermarks(*partition)?;
            let start = state.next.max(low);
            total += (high - start - state.singles.range(start..high).count() as i64).max(0) as u64;
            from.push((*partition, start));
        }
        on_progress(0, total);
        // sent in groups; progress committed after each group's acknowledgements
        const GROUP: usize = 256;
        let mut pending: Vec<(OwnedMessage, String)> = Vec::with_capacity(GROUP);
        let mut flush = |pending: &mut Vec<(OwnedMessage, String)>,
                         states: &mut Vec<(i32, Progress)>,
                         summary: &mut ReplaySummary|
         -> Result<(), DltError> {
            if pending.is_empty() {
                return Ok(());
            }
            if !dry_run {
                let records: Vec<OutgoingRecord> = pending
                    .iter()
                    .map(|(record, destination)| replay_record(&self.topic, record, destination))
                    .collect();
                let results = runtime
                    .block_on(futures::future::join_all(records.iter().map(|record| producer.send(record))));
                for result in results {
                    result?;
                }
            }
            let mut touched = BTreeSet::new();
            for (record, _) in pending.drain(..) {
                if let Some((_, state)) =
                    states.iter_mut().find(|(partition, _)| *partition == record.partition())
                {
                    state.mark(record.offset());
                    touched.insert(record.partition());
                }
                summary.replayed += 1;
            }
            if !dry_run {
                for (partition, state) in states.iter().filter(|(partition, _)| touched.contains(partition)) {
                    self.commit(*partition, state)?;
                }
            }
            on_progress(summary.replayed + summary.refused.len() as u64, total);
            Ok(())
        };
        let snapshot = states.clone();
        let ends = self.read(&from, |record| {
            let replayed_before = snapshot
                .iter()
                .find(|(partition, _)| *partition == record.partition())
                .is_some_and(|(_, state)| state.is_replayed(record.offset()));
            if replayed_before {
                summary.skipped += 1;
                return Ok(true);
            }
            match self.destination(&record, to) {
                Ok(destination) => pending.push((record, destination)),
                // not marked: the progress stops below it, the letter stays retained
                Err(refusal) => summary.refused.push(self.refuse(&record, &refusal, dry_run)),
            }
            if pending.len() >= GROUP {
                flush(&mut pending, &mut states, &mut summary)?;
            }
            Ok(true)
        })?;
        flush(&mut pending, &mut states, &mut summary)?;
        if !dry_run {
            self.advance_to_ends(&ends, &summary, &mut states)?;
        }
        Ok(summary)
    }

    /// After a replay of everything, moves each partition's progress to the end the read
    /// reached: past trailing commit markers and skipped singles too (nothing there to
    /// replay), but never past a refused letter: it stays unreplayed.
    fn advance_to_ends(
        &self,
        ends: &[(i32, i64)],
        summary: &ReplaySummary,
        states: &mut [(i32, Progress)],
    ) -> Result<(), DltError> {
        for &(partition, end) in ends {
            let first_refused = summary
                .refused
                .iter()
                .filter(|refused| refused.partition == partition)
                .map(|refused| refused.offset)
                .min();
            let end = first_refused.map_or(end, |refused| refused.min(end));
            if let Some((_, state)) = states.iter_mut().find(|(candidate, _)| *candidate == partition) {
                let before = state.clone();
                state.advance_to(end);
                if *state != before {
                    self.commit(partition, state)?;
                }
            }
        }
        Ok(())
    }
}
