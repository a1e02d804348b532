// Exits 0 once the cluster answers a metadata request (DescribeCluster) with a live controller
// and at least args[1] (default 1) brokers registered; used by scripts/stack, run with Java's
// single-file source launcher.
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeClusterResult;

public class Ready {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "3000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "5000");
        try (Admin admin = Admin.create(props)) {
            DescribeClusterResult cluster = admin.describeCluster();
            int brokers = cluster.nodes().get(5, TimeUnit.SECONDS).size();
            String id = cluster.clusterId().get(5, TimeUnit.SECONDS);
            int wanted = args.length > 1 ? Integer.parseInt(args[1]) : 1;
            if (brokers < wanted) {
                System.err.println(brokers + " of " + wanted + " broker(s) registered");
                System.exit(1);
            }
            System.out.println("cluster " + id + ": " + brokers + " broker(s)");
        } catch (Exception e) {
            System.err.println("metadata request failed: " + e);
            System.exit(1);
        }
    }
}
