-- Tessera only: each transaction runs on the node of its home warehouse.
SELECT create_distributed_function('neword(int,int,int,int[],int[],int[])', 'p_w_id', colocate_with => 'warehouse');
SELECT create_distributed_function('payment(int,int,int,int,int,text,numeric)', 'p_w_id', colocate_with => 'warehouse');
SELECT create_distributed_function('ostat(int,int,int,text)', 'p_w_id', colocate_with => 'warehouse');
SELECT create_distributed_function('delivery(int,int)', 'p_w_id', colocate_with => 'warehouse');
SELECT create_distributed_function('slev(int,int,int)', 'p_w_id', colocate_with => 'warehouse');
-- Called by payment and ostat with the customer's warehouse: where that is
-- the call's own, their copies call this function's copy (on the shards).
SELECT create_distributed_function('customer_by_name(int,int,text)', 'p_w_id', colocate_with => 'warehouse');
