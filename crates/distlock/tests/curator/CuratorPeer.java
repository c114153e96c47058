// A Curator client taking part in distlock's interoperability tests.
//
//   java CuratorPeer CONNECT KIND PATH ITERATIONS LOGFILE [PERMITS]
//
// KIND: mutex | read | write | semaphore | leader. Each iteration acquires (leader: is elected by a
// LeaderSelector whose id is "curator"), appends "<mode> enter curator" to LOGFILE, holds a few
// milliseconds, appends "<mode> exit curator", releases (leader: returns from takeLeadership).
// Appends are single O_APPEND writes, so lines from every process interleave in true order.
// KIND getleader: appends "leader-is <id>" (LeaderSelector.getLeader()'s id, "" for none).
// KIND lead-until-told: leads once as "curator", appends "W enter curator", and gives up the
// lead once LOGFILE has a line "resign curator".
// KIND latch, latch-getleader, latch-until-told: the same with a LeaderLatch whose id is "curator".
// With $CURATOR_DIGEST (user:password), the client logs in by digest and its ACLProvider gives
// every node it creates all permissions for that login and read for anyone (distlock's acl=creator).
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.api.ACLProvider;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.data.ACL;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public class CuratorPeer {
    static Path log;

    static void log(String line) throws Exception {
        Files.write(log, (line + "\n").getBytes(StandardCharsets.UTF_8), StandardOpenOption.APPEND,
                StandardOpenOption.CREATE);
    }

    static void hold(String mode) throws Exception {
        log(mode + " enter curator");
        Thread.sleep(3);
        log(mode + " exit curator");
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0], kind = args[1], path = args[2];
        int iterations = Integer.parseInt(args[3]);
        log = Paths.get(args[4]);
        int permits = args.length > 5 ? Integer.parseInt(args[5]) : 1;
        CuratorFrameworkFactory.Builder builder = CuratorFrameworkFactory.builder().connectString(connect)
                .sessionTimeoutMs(10000).connectionTimeoutMs(5000).retryPolicy(new RetryNTimes(3, 100));
        String digest = System.getenv("CURATOR_DIGEST");
        if (digest != null) {
            List<ACL> acl = Arrays.asList(new ACL(ZooDefs.Perms.ALL, ZooDefs.Ids.AUTH_IDS),
                    new ACL(ZooDefs.Perms.READ, ZooDefs.Ids.ANYONE_ID_UNSAFE));
            builder.authorization("digest", digest.getBytes(StandardCharsets.UTF_8)).aclProvider(new ACLProvider() {
                public List<ACL> getDefaultAcl() { return acl; }
                public List<ACL> getAclForPath(String path) { return acl; }
            });
        }
        CuratorFramework client = builder.build();
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            throw new IllegalStateException("no connection to " + connect);
        }
        log("ready curator");
        if (kind.equals("latch-getleader")) {
            log("leader-is " + new LeaderLatch(client, path).getLeader().getId());
            client.close();
            return;
        }
        if (kind.equals("getleader")) {
            LeaderSelector reader = new LeaderSelector(client, path, new LeaderSelectorListenerAdapter() {
                public void takeLeadership(CuratorFramework c) {}
            });
            log("leader-is " + reader.getLeader().getId());
            client.close();
            return;
        }
        InterProcessMutex mutex = new InterProcessMutex(client, path);
        InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, path);
        InterProcessSemaphoreV2 sem = new InterProcessSemaphoreV2(client, path, permits);
        for (int i = 0; i < iterations; i++) {
            switch (kind) {
                case "mutex":
                    if (!mutex.acquire(60, TimeUnit.SECONDS)) throw new IllegalStateException("mutex timeout");
                    try { hold("W"); } finally { mutex.release(); }
                    break;
                case "read":
                    if (!rw.readLock().acquire(60, TimeUnit.SECONDS)) throw new IllegalStateException("read timeout");
                    try { hold("R"); } finally { rw.readLock().release(); }
                    break;
                case "write":
                    if (!rw.writeLock().acquire(60, TimeUnit.SECONDS)) throw new IllegalStateException("write timeout");
                    try { hold("W"); } finally { rw.writeLock().release(); }
                    break;
                case "semaphore":
                    Lease lease = sem.acquire(60, TimeUnit.SECONDS);
                    if (lease == null) throw new IllegalStateException("semaphore timeout");
                    try { hold("S"); } finally { sem.returnLease(lease); }
                    break;
                case "leader":
                case "lead-until-told":
                    java.util.concurrent.CountDownLatch done = new java.util.concurrent.CountDownLatch(1);
                    boolean untilTold = kind.equals("lead-until-told");
                    LeaderSelector selector = new LeaderSelector(client, path, new LeaderSelectorListenerAdapter() {
                        public void takeLeadership(CuratorFramework c) throws Exception {
                            if (untilTold) {
                                log("W enter curator");
                                long end = System.currentTimeMillis() + 60000;
                                while (!new String(Files.readAllBytes(log), StandardCharsets.UTF_8).contains("resign curator")) {
                                    if (System.currentTimeMillis() > end) throw new IllegalStateException("never told to resign");
                                    Thread.sleep(10);
                                }
                                log("W exit curator");
                            } else {
                                hold("W");
                            }
                            done.countDown();
                        }
                    });
                    selector.setId("curator");
                    selector.start();
                    if (!done.await(60, TimeUnit.SECONDS)) throw new IllegalStateException("leader timeout");
                    selector.close();
                    break;
                case "latch":
                case "latch-until-told":
                    LeaderLatch latch = new LeaderLatch(client, path, "curator");
                    latch.start();
                    if (!latch.await(60, TimeUnit.SECONDS)) throw new IllegalStateException("latch timeout");
                    if (kind.equals("latch")) {
                        hold("W");
                    } else {
                        log("W enter curator");
                        long end = System.currentTimeMillis() + 60000;
                        while (!new String(Files.readAllBytes(log), StandardCharsets.UTF_8).contains("resign curator")) {
                            if (System.currentTimeMillis() > end) throw new IllegalStateException("never told to resign");
                            Thread.sleep(10);
                        }
                        log("W exit curator");
                    }
                    latch.close();
                    break;
                default:
                    throw new IllegalArgumentException("unknown kind " + kind);
            }
        }
        client.close();
    }
}
