//! DumpLogSegments' text parsed: one [`Log`] per partition directory, its record batches and
//! their records in log order.

use std::path::Path;

/// One record batch as DumpLogSegments prints it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub base_offset: i64,
    pub last_offset: i64,
    pub producer_id: i64,
    pub producer_epoch: i64,
    pub transactional: bool,
    pub control: bool,
    pub create_time: i64,
    pub records: Vec<Record>,
}

/// One record of a batch (`--deep-iteration`): its key and payload as printed (JSON under the
/// offsets and transaction-log decoders; `<DELETE>` for a tombstone), or a control record's
/// `endTxnMarker` (COMMIT, ABORT).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    pub offset: i64,
    pub create_time: i64,
    pub key: Option<String>,
    pub payload: Option<String>,
    pub marker: Option<String>,
}

impl Batch {
    /// A control batch's marker: COMMIT or ABORT.
    pub fn marker(&self) -> Option<&str> {
        if !self.control {
            return None;
        }
        self.records.iter().find_map(|record| record.marker.as_deref())
    }
}

/// One partition's log: its directory name (`<topic>-<partition>`) and batches in log order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Log {
    pub name: String,
    pub topic: String,
    pub partition: i32,
    pub batches: Vec<Batch>,
}

/// `name: value` in a line of DumpLogSegments, `name` a whole word.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let pattern = format!("{name}: ");
    let mut from = 0;
    while let Some(found) = line[from..].find(&pattern) {
        let at = from + found;
        if at == 0 || line.as_bytes()[at - 1] == b' ' {
            let value = &line[at + pattern.len()..];
            return Some(value.split(' ').next().unwrap_or(value));
        }
        from = at + pattern.len();
    }
    None
}

fn number(line: &str, name: &str) -> i64 {
    field(line, name).and_then(|value| value.parse().ok()).unwrap_or(-1)
}

/// `<topic>-<partition>` into its parts (a deleted partition's `…-<n>.<id>-delete` is none).
pub(super) fn partition_of(name: &str) -> Option<(&str, i32)> {
    let (topic, partition) = name.rsplit_once('-')?;
    Some((topic, partition.parse().ok()?))
}

/// DumpLogSegments' text (any decoder, `--deep-iteration`) into one [`Log`] per partition
/// directory, the segments of one directory appended in the order they were dumped.
pub fn parse(text: &str) -> Vec<Log> {
    let mut logs: Vec<Log> = Vec::new();
    for line in text.lines() {
        if let Some(file) = line.strip_prefix("Dumping ") {
            let name = Path::new(file.trim())
                .parent()
                .and_then(Path::file_name)
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            if logs.last().is_none_or(|log| log.name != name) {
                let (topic, partition) = partition_of(&name).unwrap_or((name.as_str(), -1));
                logs.push(Log {
                    topic: topic.to_owned(),
                    partition,
                    name: name.clone(),
                    batches: Vec::new(),
                });
            }
        } else if line.starts_with("baseOffset: ") {
            let Some(log) = logs.last_mut() else { continue };
            log.batches.push(Batch {
                base_offset: number(line, "baseOffset"),
                last_offset: number(line, "lastOffset"),
                producer_id: number(line, "producerId"),
                producer_epoch: number(line, "producerEpoch"),
                transactional: field(line, "isTransactional") == Some("true"),
                control: field(line, "isControl") == Some("true"),
                create_time: number(line, "CreateTime"),
                records: Vec::new(),
            });
        } else if let Some(rest) = line.strip_prefix("| ") {
            let Some(batch) = logs.last_mut().and_then(|log| log.batches.last_mut()) else { continue };
            // the key runs up to " payload: ", the payload to the end of the line
            let (key, payload) = match rest.find(" key: ") {
                Some(at) => {
                    let after = &rest[at + " key: ".len()..];
                    match after.find(" payload: ") {
                        Some(end) => (
                            Some(after[..end].to_owned()),
                            Some(after[end + " payload: ".len()..].to_owned()),
                        ),
                        None => (Some(after.to_owned()), None),
                    }
                }
                None => (None, rest.find("payload: ").map(|at| rest[at + "payload: ".len()..].to_owned())),
            };
            batch.records.push(Record {
                offset: number(rest, "offset"),
                create_time: number(rest, "CreateTime"),
                key,
                payload,
                marker: field(rest, "endTxnMarker").map(str::to_owned),
            });
        }
    }
    logs
}
