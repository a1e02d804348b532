//! Metadata lookups a client makes before it assigns itself partitions (readers of a whole
//! topic, the dead-letter tools, the load generator's outcome reader).

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
