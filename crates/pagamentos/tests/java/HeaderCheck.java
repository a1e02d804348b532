// Reads the retry records and dead letters that pagamentos wrote with kafka-clients' own API,
// the way Spring Kafka reads them (Headers.lastHeader, TimestampType.forName, ByteBuffer,
// new BigInteger(bytes)), and checks every header of docs/reference/contract.md §3 that it finds; and that
// the original record's partition is the one Java's partitioner picks for its key.
//
// Run by crates/pagamentos/tests/spring_headers.rs as a single-file program:
//   java -cp '<kafka libs>/*' HeaderCheck.java bootstrap=HOST:PORT retried-topic=T
//       retry-group=G retry-exception=FQCN retry-cause=FQCN blocking-topic=S
//       blocking-group=G blocking-exception=FQCN blocking-cause=FQCN
// It reads the first record of T-retry-1000, T-retry-2000, T-retry-4000, T-dlt (the hops of
// one record that failed every attempt) and S-dlt (a blocking handler's dead letter), prints one
// line per check, and exits 0 when all pass, 1 when any fails, 2 when the records are missing.

import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.utils.Utils;

public class HeaderCheck {

    private static final long[] DELAYS_MS = {1000, 2000, 4000, 0}; // the hop to -dlt: due at once

    private static final List<String> failed = new ArrayList<>();

    private static final Map<String, Integer> partitionCounts = new HashMap<>();

    private static int checks;

    public static void main(String[] args) {
        Map<String, String> options = new HashMap<>();
        for (String arg : args) {
            int equals = arg.indexOf('=');
            if (equals < 1) {
                usage("not key=value: " + arg);
            }
            options.put(arg.substring(0, equals), arg.substring(equals + 1));
        }
        String retried = need(options, "retried-topic");
        String blocking = need(options, "blocking-topic") + "-dlt";
        List<String> hops = List.of(retried + "-retry-1000", retried + "-retry-2000",
                retried + "-retry-4000", retried + "-dlt");
        List<String> topics = new ArrayList<>(hops);
        topics.add(blocking);
        Map<String, ConsumerRecord<byte[], byte[]>> first = firstRecords(need(options, "bootstrap"), topics,
                List.of(retried, need(options, "blocking-topic")), Duration.ofSeconds(90));
        for (String topic : topics) {
            if (!first.containsKey(topic)) {
                System.out.println("MISSING no record on " + topic + " within 90 s");
                System.exit(2);
            }
        }
        for (int hop = 1; hop <= hops.size(); hop++) {
            retryRecord(first.get(hops.get(hop - 1)), hop, retried, options);
        }
        blockingDeadLetter(first.get(blocking), options);
        System.out.println(checks + " checks, " + failed.size() + " failed");
        for (String failure : failed) {
            System.out.println("FAILED " + failure);
        }
        System.exit(failed.isEmpty() ? 0 : 1);
    }

    /** Hop `hop` (1 = retry-1000, 4 = -dlt) of the record that failed every attempt. */
    private static void retryRecord(ConsumerRecord<byte[], byte[]> record, int hop, String retried,
            Map<String, String> options) {
        String at = record.topic() + " ";
        Headers headers = record.headers();
        // the original family and the group: once, from the first hop
        for (String name : List.of("kafka_original-topic", "kafka_original-partition",
                "kafka_original-offset", "kafka_original-timestamp", "kafka_original-timestamp-type",
                "kafka_dlt-original-consumer-group")) {
            check(at + name + " occurs once", count(headers, name) == 1, count(headers, name));
        }
        checkTimestampType(at, headers, "kafka_original-timestamp-type");
        check(at + "kafka_original-topic", retried.equals(text(headers, "kafka_original-topic")),
                text(headers, "kafka_original-topic"));
        Integer partition = intValue(at, headers, "kafka_original-partition");
        check(at + "kafka_original-partition = the record's partition (kept by every hop)",
                partition != null && partition == record.partition(), partition);
        checkPartitioner(at, record, retried, partition);
        Long offset = longValue(at, headers, "kafka_original-offset");
        check(at + "kafka_original-offset >= 0", offset != null && offset >= 0, offset);
        Long originalTimestamp = longValue(at, headers, "kafka_original-timestamp");
        check(at + "kafka_original-timestamp > 0", originalTimestamp != null && originalTimestamp > 0,
                originalTimestamp);
        check(at + "kafka_dlt-original-consumer-group",
                need(options, "retry-group").equals(text(headers, "kafka_dlt-original-consumer-group")),
                text(headers, "kafka_dlt-original-consumer-group"));

        // the retry headers: one value a hop, lastHeader the newest
        for (String name : List.of("retry_topic-attempts", "retry_topic-backoff-timestamp",
                "retry_topic-original-timestamp")) {
            check(at + name + " has " + hop + " value(s)", count(headers, name) == hop, count(headers, name));
        }
        List<Integer> attempts = new ArrayList<>();
        for (Header header : headers.headers("retry_topic-attempts")) {
            attempts.add(header.value().length == 4 ? ByteBuffer.wrap(header.value()).getInt() : null);
        }
        List<Integer> expectedAttempts = new ArrayList<>();
        for (int value = 2; value <= hop + 1; value++) {
            expectedAttempts.add(value);
        }
        check(at + "retry_topic-attempts values, oldest first", attempts.equals(expectedAttempts), attempts);
        Integer lastAttempt = intValue(at, headers, "retry_topic-attempts");
        check(at + "lastHeader(retry_topic-attempts) = " + (hop + 1), lastAttempt != null && lastAttempt == hop + 1,
                lastAttempt);
        Long backoff = bigInteger(at, headers.lastHeader("retry_topic-backoff-timestamp"), "retry_topic-backoff-timestamp");
        if (backoff != null) {
            // failure time = backoff - the destination's delay: before the record was produced,
            // and not long before
            long failureTime = backoff - DELAYS_MS[hop - 1];
            check(at + "lastHeader(retry_topic-backoff-timestamp) = failure time + " + DELAYS_MS[hop - 1] + " ms",
                    failureTime <= record.timestamp() && failureTime > record.timestamp() - 60_000,
                    "backoff " + backoff + ", record timestamp " + record.timestamp());
        }
        long previous = Long.MIN_VALUE;
        for (Header header : headers.headers("retry_topic-backoff-timestamp")) {
            Long value = bigInteger(at, header, "retry_topic-backoff-timestamp value");
            check(at + "retry_topic-backoff-timestamp values increase hop by hop", value != null && value > previous,
                    value + " after " + previous);
            previous = value == null ? previous : value;
        }
        for (Header header : headers.headers("retry_topic-original-timestamp")) {
            Long value = bigInteger(at, header, "retry_topic-original-timestamp");
            check(at + "retry_topic-original-timestamp = kafka_original-timestamp",
                    value != null && value.equals(originalTimestamp), value + " vs " + originalTimestamp);
        }

        // the exception headers: one value a hop, the cause type always there
        for (String name : List.of("kafka_exception-fqcn", "kafka_exception-cause-fqcn",
                "kafka_exception-message", "kafka_exception-stacktrace")) {
            check(at + name + " has " + hop + " value(s)", count(headers, name) == hop, count(headers, name));
        }
        check(at + "kafka_exception-fqcn",
                need(options, "retry-exception").equals(text(headers, "kafka_exception-fqcn")),
                text(headers, "kafka_exception-fqcn"));
        check(at + "kafka_exception-cause-fqcn present",
                need(options, "retry-cause").equals(text(headers, "kafka_exception-cause-fqcn")),
                text(headers, "kafka_exception-cause-fqcn"));
        check(at + "kafka_exception-message not empty", notEmpty(text(headers, "kafka_exception-message")),
                text(headers, "kafka_exception-message"));
        check(at + "kafka_exception-stacktrace not empty", notEmpty(text(headers, "kafka_exception-stacktrace")),
                text(headers, "kafka_exception-stacktrace"));
    }

    /** A blocking handler's dead letter: the kafka_dlt-* family, each header once. */
    private static void blockingDeadLetter(ConsumerRecord<byte[], byte[]> record, Map<String, String> options) {
        String at = record.topic() + " ";
        Headers headers = record.headers();
        for (String name : List.of("kafka_dlt-original-topic", "kafka_dlt-original-partition",
                "kafka_dlt-original-offset", "kafka_dlt-original-timestamp", "kafka_dlt-original-timestamp-type",
                "kafka_dlt-original-consumer-group", "kafka_dlt-exception-fqcn", "kafka_dlt-exception-cause-fqcn",
                "kafka_dlt-exception-message", "kafka_dlt-exception-stacktrace")) {
            check(at + name + " occurs once", count(headers, name) == 1, count(headers, name));
        }
        checkTimestampType(at, headers, "kafka_dlt-original-timestamp-type");
        String source = need(options, "blocking-topic");
        check(at + "kafka_dlt-original-topic", source.equals(text(headers, "kafka_dlt-original-topic")),
                text(headers, "kafka_dlt-original-topic"));
        Integer partition = intValue(at, headers, "kafka_dlt-original-partition");
        check(at + "kafka_dlt-original-partition = the record's partition", partition != null
                && partition == record.partition(), partition);
        checkPartitioner(at, record, source, partition);
        Long offset = longValue(at, headers, "kafka_dlt-original-offset");
        check(at + "kafka_dlt-original-offset >= 0", offset != null && offset >= 0, offset);
        Long timestamp = longValue(at, headers, "kafka_dlt-original-timestamp");
        check(at + "kafka_dlt-original-timestamp not after the dead letter's",
                timestamp != null && timestamp > 0 && timestamp <= record.timestamp(), timestamp);
        check(at + "kafka_dlt-original-consumer-group",
                need(options, "blocking-group").equals(text(headers, "kafka_dlt-original-consumer-group")),
                text(headers, "kafka_dlt-original-consumer-group"));
        check(at + "kafka_dlt-exception-fqcn",
                need(options, "blocking-exception").equals(text(headers, "kafka_dlt-exception-fqcn")),
                text(headers, "kafka_dlt-exception-fqcn"));
        check(at + "kafka_dlt-exception-cause-fqcn",
                need(options, "blocking-cause").equals(text(headers, "kafka_dlt-exception-cause-fqcn")),
                text(headers, "kafka_dlt-exception-cause-fqcn"));
        check(at + "kafka_dlt-exception-message not empty", notEmpty(text(headers, "kafka_dlt-exception-message")),
                text(headers, "kafka_dlt-exception-message"));
        check(at + "no retry_topic-attempts", headers.lastHeader("retry_topic-attempts") == null, "present");
    }

    /** The original was produced by our murmur2_random producer: where Java's would put its key. */
    private static void checkPartitioner(String at, ConsumerRecord<byte[], byte[]> record, String source,
            Integer partition) {
        Integer count = partitionCounts.get(source);
        if (record.key() == null || count == null || partition == null) {
            check(at + "key and partition count of " + source + " known", false, "key " + record.key()
                    + ", partitions " + count);
            return;
        }
        int java = Utils.toPositive(Utils.murmur2(record.key())) % count;
        check(at + "original partition = Java's partitioner for key " + new String(record.key(), StandardCharsets.UTF_8),
                java == partition, partition + " vs Java's " + java);
    }

    /** TimestampType.forName: what Spring's listeners and tools call on this header. */
    private static void checkTimestampType(String at, Headers headers, String name) {
        String value = text(headers, name);
        try {
            TimestampType type = TimestampType.forName(value);
            check(at + "TimestampType.forName(" + name + ") = CREATE_TIME", type == TimestampType.CREATE_TIME, type);
        } catch (RuntimeException e) {
            check(at + "TimestampType.forName(" + name + ")", false, e);
        }
    }

    private static Integer intValue(String at, Headers headers, String name) {
        Header header = headers.lastHeader(name);
        boolean ok = header != null && header.value() != null && header.value().length == Integer.BYTES;
        check(at + name + " is a 4-byte int", ok, header == null ? "absent" : length(header));
        return ok ? ByteBuffer.wrap(header.value()).getInt() : null;
    }

    private static Long longValue(String at, Headers headers, String name) {
        Header header = headers.lastHeader(name);
        boolean ok = header != null && header.value() != null && header.value().length == Long.BYTES;
        check(at + name + " is an 8-byte long", ok, header == null ? "absent" : length(header));
        return ok ? ByteBuffer.wrap(header.value()).getLong() : null;
    }

    /** new BigInteger(bytes), and the bytes are what BigInteger.toByteArray() writes. */
    private static Long bigInteger(String at, Header header, String what) {
        if (header == null || header.value() == null || header.value().length == 0) {
            check(at + what + " is a BigInteger", false, "absent or empty");
            return null;
        }
        try {
            long value = new BigInteger(header.value()).longValueExact();
            check(at + what + " is BigInteger.toByteArray() (" + header.value().length + " bytes)",
                    java.util.Arrays.equals(BigInteger.valueOf(value).toByteArray(), header.value()), value);
            return value;
        } catch (ArithmeticException e) {
            check(at + what + " fits a long", false, e);
            return null;
        }
    }

    private static String text(Headers headers, String name) {
        Header header = headers.lastHeader(name);
        return header == null || header.value() == null ? null : new String(header.value(), StandardCharsets.UTF_8);
    }

    private static int count(Headers headers, String name) {
        int count = 0;
        for (Header ignored : headers.headers(name)) {
            count++;
        }
        return count;
    }

    private static String length(Header header) {
        return header.value() == null ? "no value" : header.value().length + " bytes";
    }

    private static boolean notEmpty(String text) {
        return text != null && !text.isEmpty();
    }

    private static void check(String what, boolean ok, Object detail) {
        checks++;
        if (ok) {
            System.out.println("ok     " + what);
        } else {
            failed.add(what + " (got: " + detail + ")");
            System.out.println("FAILED " + what + " (got: " + detail + ")");
        }
    }

    /**
     * The first committed record of each topic, read from the beginning of every partition; the
     * partition counts of `sources` into partitionCounts.
     */
    private static Map<String, ConsumerRecord<byte[], byte[]>> firstRecords(String bootstrap, List<String> topics,
            List<String> sources, Duration within) {
        Properties properties = new Properties();
        properties.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        properties.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        properties.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        properties.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed"); // antifraude's are transactional
        properties.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        properties.put(ConsumerConfig.CLIENT_ID_CONFIG, "header-check");
        Map<String, ConsumerRecord<byte[], byte[]>> first = new LinkedHashMap<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(properties)) {
            for (String source : sources) {
                partitionCounts.put(source, consumer.partitionsFor(source, Duration.ofSeconds(30)).size());
            }
            List<TopicPartition> partitions = new ArrayList<>();
            for (String topic : topics) {
                for (PartitionInfo info : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
                    partitions.add(new TopicPartition(topic, info.partition()));
                }
            }
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            long deadline = System.nanoTime() + within.toNanos();
            while (first.size() < topics.size() && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(500))) {
                    first.putIfAbsent(record.topic(), record);
                }
            }
        }
        return first;
    }

    private static String need(Map<String, String> options, String key) {
        String value = options.get(key);
        if (value == null) {
            usage("missing " + key + "=…");
        }
        return value;
    }

    private static void usage(String problem) {
        System.out.println("HeaderCheck: " + problem);
        System.exit(2);
    }
}
