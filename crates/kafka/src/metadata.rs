//! Metadata lookups a client makes before it assigns itself partitions (readers of a whole
//! topic, the dead-letter tools, the load generator's outcome reader), and the partitions'
//! start and end offsets, many partitions per request (the lag and dead-letter gauges).

use std::time::Duration;

/// The partition ids of `topic`, as `client`'s metadata has them; empty when the topic does not
/// exist (or its metadata carries an error).
pub fn partitions<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
    timeout: Duration,
) -> rdkafka::error::KafkaResult<Vec<i32>> {
    let metadata = client.fetch_metadata(Some(topic), timeout)?;
    Ok(metadata
        .topics()
        .iter()
        .find(|meta| meta.name() == topic && meta.error().is_none())
        .map(|meta| meta.partitions().iter().map(|partition| partition.id()).collect())
        .unwrap_or_default())
}

/// Where to look in [`offsets_at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The log start offset (the low watermark).
    Start,
    /// The end offset: the high watermark, or for a `read_committed` client its last stable
    /// offset.
    Last,
}

/// The start or end offset of each of `partitions` (topic, partition), asked in one
/// `ListOffsets` request per partition leader: every partition is in the answer, or the call
/// fails with the first partition's error. librdkafka's watermark query asks one partition at
/// a time with two requests: for a 12-partition topic, 24 requests against 1 here.
pub fn offsets_at<C: rdkafka::consumer::Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
    consumer: &C,
    partitions: &[(String, i32)],
    end: End,
    timeout: Duration,
) -> rdkafka::error::KafkaResult<std::collections::HashMap<(String, i32), i64>> {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;
    use rdkafka::Offset;
    if partitions.is_empty() {
        return Ok(Default::default());
    }
    // `offsets_for_times` takes `ListOffsets`' timestamps: -1 latest, -2 earliest
    let at = match end {
        End::Start => Offset::Beginning,
        End::Last => Offset::End,
    };
    let mut list = rdkafka::TopicPartitionList::with_capacity(partitions.len());
    for (topic, partition) in partitions {
        list.add_partition_offset(topic, *partition, at)?;
    }
    let answered = consumer.offsets_for_times(list, timeout)?;
    let mut offsets = std::collections::HashMap::with_capacity(partitions.len());
    for element in answered.elements() {
        element.error()?;
        match element.offset() {
            Offset::Offset(offset) => {
                offsets.insert((element.topic().to_owned(), element.partition()), offset)
            }
            _ => return Err(KafkaError::OffsetFetch(RDKafkaErrorCode::NoOffset)),
        };
    }
    if offsets.len() < partitions.len() {
        return Err(KafkaError::OffsetFetch(RDKafkaErrorCode::NoOffset));
    }
    Ok(offsets)
}
