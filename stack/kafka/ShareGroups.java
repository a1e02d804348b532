// Makes sure the cluster serves share groups (KIP-932): the finalized share.version feature is
// at least 1, upgrading it when it is not (a cluster formatted before Kafka 4.2, or with
// share.version=0); never downgrades. Used by scripts/stack once Kafka is ready, run with
// Java's single-file source launcher. Exit 0 when share groups are on.
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.FeatureMetadata;
import org.apache.kafka.clients.admin.FeatureUpdate;
import org.apache.kafka.clients.admin.FinalizedVersionRange;
import org.apache.kafka.clients.admin.UpdateFeaturesOptions;

public class ShareGroups {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            FeatureMetadata features = admin.describeFeatures().featureMetadata().get(30, TimeUnit.SECONDS);
            FinalizedVersionRange finalized = features.finalizedFeatures().get("share.version");
            short level = finalized == null ? 0 : finalized.maxVersionLevel();
            if (level >= 1) {
                System.out.println("share.version=" + level + ": share groups on");
                return;
            }
            if (!features.supportedFeatures().containsKey("share.version")) {
                System.err.println("this Kafka does not support share groups (share.version): Kafka 4.2 or later needed");
                System.exit(1);
            }
            admin.updateFeatures(Map.of("share.version", new FeatureUpdate((short) 1, FeatureUpdate.UpgradeType.UPGRADE)),
                new UpdateFeaturesOptions()).all().get(30, TimeUnit.SECONDS);
            System.out.println("share.version " + level + " -> 1: share groups on");
        } catch (Exception e) {
            System.err.println("share.version check failed: " + e);
            System.exit(1);
        }
    }
}
