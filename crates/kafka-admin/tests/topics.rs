//! Topic administration against the real broker of the local stack (`scripts/stack up`).

use testkit::unique;

#[tokio::test]
async fn ensure_topics_is_idempotent_and_reports_differences() {
    testkit::init_logs();
    let mut args = testkit::kafka_args();
    args.topic_prefix = format!("{}.", unique("t"));
    let specs = contracts::topics::plan(&args.topic_prefix);
    let names: Vec<&str> = specs.iter().map(|spec| spec.name.as_str()).collect();
    let settings = kafka::TopicArgs { partitions: 2, replicas: 1 };

    let first = kafka_admin::topics::ensure(&args, &settings, &specs).await.expect("first run");
    assert!(first.topics.iter().all(|t| t.outcome == kafka_admin::topics::Outcome::Created), "{first}");
    assert_eq!(first.topics.len(), 14);
    let second = kafka_admin::topics::ensure(&args, &settings, &specs).await.expect("second run");
    assert!(second.topics.iter().all(|t| t.outcome == kafka_admin::topics::Outcome::Verified), "{second}");

    let more = kafka::TopicArgs { partitions: 3, replicas: 1 };
    let third = kafka_admin::topics::ensure(&args, &more, &specs).await.expect("third run");
    assert!(!third.is_consistent());
    for status in &third.topics {
        match &status.outcome {
            kafka_admin::topics::Outcome::Differs(why) => {
                assert_eq!(why, &vec!["2 partitions, configured 3".to_owned()], "{}", status.name)
            }
            other => panic!("{}: {other:?}", status.name),
        }
    }
    kafka_admin::topics::delete(&args, &names).await.expect("clean up");
}
