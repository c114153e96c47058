// Apache Curator's InterProcessMutex, measured for `distlock bench --curator` on the same server
// and through the same proxy as distlock, in turns with it.
//
//   java CuratorBench CONNECT
//
// Reads one command per line on stdin and answers one line on stdout:
//   uncontended PATH MILLIS          -> ok CYCLES NANOS
//   contended PATH CLIENTS MILLIS    -> ok HANDOFFS NANOS MIN_PER_CLIENT MAX_PER_CLIENT
// or "error <why>". A cycle is acquire() then release(); each contended client is a session of
// its own, connected before the clock starts.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorBench {
    static CuratorFramework connect(String connect) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryNTimes(3, 100));
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            throw new IllegalStateException("no connection to " + connect);
        }
        return client;
    }

    static void take(InterProcessMutex mutex) throws Exception {
        if (!mutex.acquire(30, TimeUnit.SECONDS)) {
            throw new IllegalStateException("not acquired within 30 s");
        }
    }

    static String uncontended(CuratorFramework client, String path, long millis) throws Exception {
        InterProcessMutex mutex = new InterProcessMutex(client, path);
        long start = System.nanoTime();
        long until = start + millis * 1_000_000L;
        long cycles = 0;
        while (System.nanoTime() < until) {
            take(mutex);
            mutex.release();
            cycles++;
        }
        return "ok " + cycles + " " + (System.nanoTime() - start);
    }

    static String contended(String connect, String path, int clients, long millis) throws Exception {
        List<CuratorFramework> sessions = new ArrayList<>();
        try {
            for (int i = 0; i < clients; i++) {
                sessions.add(connect(connect));
            }
            long[] counts = new long[clients];
            Thread[] threads = new Thread[clients];
            AtomicReference<Exception> failed = new AtomicReference<>();
            long start = System.nanoTime();
            long until = start + millis * 1_000_000L;
            for (int i = 0; i < clients; i++) {
                final int k = i;
                threads[i] = new Thread(() -> {
                    try {
                        InterProcessMutex mutex = new InterProcessMutex(sessions.get(k), path);
                        while (System.nanoTime() < until && failed.get() == null) {
                            take(mutex);
                            mutex.release();
                            counts[k]++;
                        }
                    } catch (Exception e) {
                        failed.set(e);
                    }
                });
                threads[i].start();
            }
            for (Thread t : threads) {
                t.join();
            }
            long elapsed = System.nanoTime() - start;
            if (failed.get() != null) {
                throw failed.get();
            }
            long total = 0, min = Long.MAX_VALUE, max = 0;
            for (long c : counts) {
                total += c;
                min = Math.min(min, c);
                max = Math.max(max, c);
            }
            return "ok " + total + " " + elapsed + " " + min + " " + max;
        } finally {
            for (CuratorFramework s : sessions) {
                s.close();
            }
        }
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0];
        CuratorFramework client = connect(connect);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split(" ");
            String answer;
            try {
                switch (w[0]) {
                    case "uncontended":
                        answer = uncontended(client, w[1], Long.parseLong(w[2]));
                        break;
                    case "contended":
                        answer = contended(connect, w[1], Integer.parseInt(w[2]), Long.parseLong(w[3]));
                        break;
                    default:
                        answer = "error unknown command " + w[0];
                }
            } catch (Exception e) {
                answer = "error " + e.toString().replace('\n', ' ');
            }
            System.out.println(answer);
            System.out.flush();
        }
        client.close();
    }
}
